//! The fault matrix, end to end: real programs under the preload (both
//! ends, so their connection is SDP, asserted from the state export), a
//! fault in the middle of their work, and what a TCP program must see:
//!
//! * no hang: every wait is bounded by [`CASE_LIMIT`]; on a timeout the
//!   test prints the state export and every program's transcript;
//! * the errno or end of file TCP gives, checked against the same program
//!   over plain TCP where TCP has an answer (each such case runs plain,
//!   then preloaded, and prints both outcomes);
//! * every byte delivered before the fault is right: the programs send a
//!   seeded pattern ([`PEER`]) and the receiver checks each byte it gets;
//! * the data cases (a killed peer, a close with unread data, a shutdown)
//!   preloaded twice ([`Via`]): on the same-host path, which is on by
//!   default between two processes of one host, and on the wire path
//!   (`SDP_LOCAL=off`); a killed peer and a close with unread data wait
//!   until the state export shows the bytes going that way before the
//!   fault.
//!
//! Faults: the peer process killed (each direction; the survivor blocking,
//! nonblocking in a `poll` loop, or under `epoll`); a close with unread
//! data, and `shutdown(SHUT_WR)`; the port mapper killed before a connect,
//! while connections are open, and restarted (the client's answer cache,
//! `portmapper/src/client.rs`, decides what the old process sees); 30 % of
//! the port mapper's datagrams lost; one byte of an FPDU flipped in
//! flight; a reset and a silent listener on the SDP port; a link taken
//! down between two network namespaces (keepalive, `SO_RCVTIMEO`).
//!
//! The proxies ([`sdp_tests::proxy`]) reach the SDP connection without a
//! hook in the preload: a UDP proxy between the client and its port mapper
//! rewrites the PMAccept's ApPort, so the client's SDP connection goes to
//! a TCP proxy (or a closed port, or a silent listener) instead of the
//! server's hidden SDP port.

use sdp_tests::e2e::{
    self, expect_sdp, expect_tcp, field, Env, Proc, Waited, ECHO_CLIENT, ECHO_SERVER,
};
use sdp_tests::netns::{NetPair, Side};
use sdp_tests::preload::{self, Mode};
use sdp_tests::proxy::{Corrupt, TcpProxy, UdpProxy, UdpProxyConfig};
use sdp_tests::statfile::{self, Record};
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// How long one run of a case may take, all its waits together (well
/// below `e2e::STEP`; the runs take a few seconds).
const CASE_LIMIT: Duration = Duration::from_secs(25);

/// The peer program of most cases. `key=value` arguments:
///
/// * `role=listen` (prints `listening PORT PID`, accepts one connection;
///   `host=` the address, default 127.0.0.1) or `role=connect host= port=`;
/// * `dir=send` (the pattern, forever) or `dir=recv` (checks every byte);
/// * `io=block`, `poll` (nonblocking socket, `poll` loop) or `epoll`;
/// * `seed=` of the pattern; `report=N`: prints `progress N` once N bytes
///   moved (with `stall=1`, then waits for a line on standard input before
///   it goes on); `close_unread=N` (with `dir=recv`): after N bytes, waits
///   until more is readable, prints `closing N unread True ok True`,
///   closes the socket with those bytes unread and waits for standard
///   input;
/// * `keepalive=IDLE,INTVL,CNT`, `rcvtimeo=SECS`: set on the connection.
///
/// Prints `connected PID FD` once connected, and at the end (an error, or
/// the end of the stream) `end OUTCOME bytes N ok BOOL bad_at N`, OUTCOME
/// being `EOF` or the errno's name, `ok` whether every byte received
/// matched the pattern and `bad_at` the first that did not (-1); then
/// holds its socket (and its state export) until standard input closes.
const PEER: &str = r#"
import errno, os, random, select, socket, struct, sys
args = dict(a.split("=", 1) for a in sys.argv[1:])
role, direction = args["role"], args["dir"]
io = args.get("io", "block")
report = int(args.get("report", "0"))
close_unread = int(args.get("close_unread", "-1"))
stall = args.get("stall") == "1"
P = (1 << 20) + 7
pat = random.Random(int(args.get("seed", "1"))).randbytes(P)
pat2 = pat + pat
CHUNK = 65536

if role == "listen":
    srv = socket.socket()
    srv.bind((args.get("host", "127.0.0.1"), 0))
    srv.listen(1)
    print("listening", srv.getsockname()[1], os.getpid(), flush=True)
    s, _ = srv.accept()
else:
    s = socket.socket()
    s.connect((args["host"], int(args["port"])))
if "keepalive" in args:
    idle, intvl, cnt = (int(x) for x in args["keepalive"].split(","))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, intvl)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, cnt)
if "rcvtimeo" in args:
    t = float(args["rcvtimeo"])
    tv = struct.pack("ll", int(t), int(round((t % 1) * 1e6)))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
print("connected", os.getpid(), s.fileno(), flush=True)

total, ok, bad_at, reported = 0, True, -1, False

def check(d):
    global total, ok, bad_at
    off = total % P
    if d != pat2[off:off + len(d)]:
        if ok:
            bad_at = total + next(i for i in range(len(d)) if d[i] != pat2[off + i])
        ok = False
    total += len(d)

def step():
    global total, reported
    if direction == "recv":
        d = s.recv(4 * CHUNK)
        if not d:
            return "EOF"
        check(d)
    else:
        off = total % P
        total += s.send(memoryview(pat2)[off:off + CHUNK], socket.MSG_NOSIGNAL)
    if report and not reported and total >= report:
        reported = True
        print("progress", total, flush=True)
        if stall:
            sys.stdin.readline()
    if direction == "recv" and 0 <= close_unread <= total:
        s.setblocking(True)
        more = select.select([s], [], [], 20)[0]
        print("closing", total, "unread", len(more) == 1, "ok", ok, flush=True)
        s.close()
        sys.stdin.read()
        sys.exit(0)
    return None

outcome = None
try:
    if io == "block":
        while outcome is None:
            outcome = step()
    else:
        s.setblocking(False)
        if io == "poll":
            p = select.poll()
            p.register(s, select.POLLIN if direction == "recv" else select.POLLOUT)
            wait = lambda: p.poll(1000)
        else:
            ep = select.epoll()
            ep.register(s.fileno(), select.EPOLLIN if direction == "recv" else select.EPOLLOUT)
            wait = lambda: ep.poll(1.0)
        while outcome is None:
            wait()
            try:
                while outcome is None:
                    outcome = step()
            except BlockingIOError:
                pass
except OSError as e:
    outcome = errno.errorcode.get(e.errno, str(e.errno))
print("end", outcome, "bytes", total, "ok", ok, "bad_at", bad_at, flush=True)
sys.stdin.read()
"#;

/// One run of a case: its programs, and one deadline for all its waits.
/// A failure shows the state export and every program's transcript.
struct Run<'e> {
    env: &'e Env,
    what: String,
    procs: Vec<Proc>,
    deadline: Instant,
}

impl<'e> Run<'e> {
    fn new(env: &'e Env, what: impl Into<String>) -> Run<'e> {
        Run {
            env,
            what: what.into(),
            procs: Vec::new(),
            deadline: Instant::now() + CASE_LIMIT,
        }
    }

    fn spawn(&mut self, name: &str, cmd: Command, stdin: bool) -> usize {
        self.procs.push(Proc::spawn(name, cmd, stdin));
        self.procs.len() - 1
    }

    /// The first line of program `i` that starts with `prefix`.
    fn line(&mut self, i: usize, prefix: &str) -> String {
        let left = self.deadline.saturating_duration_since(Instant::now());
        self.line_within(i, prefix, left)
    }

    /// [`Run::line`], within `within` (and the run's deadline).
    fn line_within(&mut self, i: usize, prefix: &str, within: Duration) -> String {
        let left = self.deadline.saturating_duration_since(Instant::now());
        match self.procs[i].try_wait_line(within.min(left), |l| l.starts_with(prefix)) {
            Ok(l) => l,
            Err(Waited::TimedOut) => self.fail(&format!(
                "{} printed no {prefix:?} line within {:?} (a hang)",
                self.procs[i].name,
                within.min(left)
            )),
            Err(Waited::Ended) => self.fail(&format!(
                "{} ended without a {prefix:?} line",
                self.procs[i].name
            )),
        }
    }

    fn kill(&self, i: usize) {
        self.procs[i].signal(libc::SIGKILL);
    }

    fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            let msg = what();
            self.fail(&msg);
        }
    }

    fn fail(&mut self, msg: &str) -> ! {
        let mut out = String::new();
        for p in &mut self.procs {
            // Whatever the program printed meanwhile, into its transcript.
            let _ = p.try_wait_line(Duration::ZERO, |_| false);
            out.push_str(&p.transcript());
            out.push('\n');
        }
        let files = statfile::live(self.env.stat_dir());
        panic!(
            "{}: {msg}\n--- state export ---\n{}--- programs ---\n{out}",
            self.what,
            e2e::dump(&files)
        );
    }
}

/// The words of a line after its first.
fn words(line: &str) -> Vec<&str> {
    line.split_whitespace().skip(1).collect()
}

/// The value after `key` in a line of `key value` pairs.
fn value<T: std::str::FromStr>(line: &str, key: &str) -> T {
    let w: Vec<&str> = line.split_whitespace().collect();
    w.iter()
        .position(|x| *x == key)
        .and_then(|i| w.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {line:?}"))
}

/// The last line of [`PEER`].
#[derive(Clone, Debug, PartialEq, Eq)]
struct End {
    outcome: String,
    bytes: u64,
    ok: bool,
    bad_at: i64,
}

impl End {
    fn parse(line: &str) -> End {
        End {
            outcome: words(line)[0].to_owned(),
            bytes: value(line, "bytes"),
            ok: value::<String>(line, "ok") == "True",
            bad_at: value(line, "bad_at"),
        }
    }
}

/// `PID FD` of a `connected` line.
fn pid_fd(line: &str) -> (u32, usize) {
    let w = words(line);
    (w[0].parse().unwrap(), w[1].parse().unwrap())
}

/// The connection `fd` of `pid`, once decided, asserted SDP.
fn assert_sdp(env: &Env, what: &str, pid: u32, fd: usize) -> Record {
    let r = env.wait_records(what, pid, 1, |r| r.fd == fd);
    expect_sdp(what, &r[0]);
    r[0].clone()
}

fn peer(env: &Env, mode: Mode, args: &[String]) -> Command {
    let mut cmd = env.python(PEER, mode);
    cmd.args(args);
    cmd
}

fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Plain => "plain TCP",
        _ => "preloaded",
    }
}

/// How the programs of a data case talk: plain TCP (the reference), or
/// preloaded with their bytes written into each other's memory (the
/// same-host path, DESIGN §9, on by default between two processes of one
/// host) or kept on the connection (`SDP_LOCAL=off`, the wire path).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Via {
    Tcp,
    Local,
    Wire,
}

impl Via {
    const ALL: [Via; 3] = [Via::Tcp, Via::Local, Via::Wire];

    fn mode(self) -> Mode {
        match self {
            Via::Tcp => Mode::Plain,
            Via::Local | Via::Wire => Mode::Sdp,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Via::Tcp => "plain TCP",
            Via::Local => "preloaded, same-host path",
            Via::Wire => "preloaded, wire path",
        }
    }

    /// A program of `script`, run this way.
    fn python(self, env: &Env, script: &str) -> Command {
        let mut cmd = env.python(script, self.mode());
        if self == Via::Wire {
            cmd.env("SDP_LOCAL", "off");
        }
        cmd
    }

    /// [`PEER`] with `args`, run this way.
    fn peer(self, env: &Env, args: &[String]) -> Command {
        let mut cmd = self.python(env, PEER);
        cmd.args(args);
        cmd
    }

    /// Waits until connection `fd` of `pid` shows its bytes going this
    /// way: on the same-host path, some written into the peer's ring or
    /// into ours; on the wire path, none, the path turned off, once the
    /// export shows bytes moved (statistics are published every 200 ms).
    fn wait_for_path(self, env: &Env, what: &str, pid: u32, fd: usize) {
        match self {
            Via::Tcp => {}
            Via::Local => {
                env.wait_records(what, pid, 1, |r| {
                    r.fd == fd && r.same_host_bytes.iter().sum::<u64>() > 0
                });
            }
            Via::Wire => {
                let r = env.wait_records(what, pid, 1, |r| {
                    r.fd == fd && r.counters.iter().sum::<u64>() > 0
                });
                assert_eq!(r[0].same_host & 0xffff, 2, "{what}: {:?}", r[0]);
                assert_eq!(r[0].same_host_bytes, [0, 0], "{what}: {:?}", r[0]);
            }
        }
    }
}

/// Starts a listening [`PEER`]; returns it and its port.
fn listening(run: &mut Run, name: &str, cmd: Command) -> (usize, u16) {
    let i = run.spawn(name, cmd, true);
    let l = run.line(i, "listening ");
    (i, words(&l)[0].parse().unwrap())
}

/// Whether the suite expects SDP between preloaded programs; in the `tcp`
/// mode (`SDP_E2E_EXPECT=tcp`, a build without the SDP backend) the cases
/// about the port mapper and the SDP connection's path have nothing to
/// test, and say so.
fn sdp_expected(case: &str) -> bool {
    let sdp = e2e::expect() == e2e::Expect::Sdp;
    if !sdp {
        eprintln!("{case}: skipped, SDP_E2E_EXPECT=tcp (no SDP connection to put a fault in)");
    }
    sdp
}

// ---------------------------------------------------------------------
// 1. The peer process killed mid-transfer.

/// What the survivor does while its peer is killed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Survivor {
    /// It reads; the writer is killed.
    Reader,
    /// It writes; the reader is killed.
    Writer,
}

/// One run: the survivor (the server, `io`) and the victim (the client,
/// blocking) move the pattern; once 4 MiB moved and the bytes take the
/// path `via` names, the victim is killed; returns the survivor's end
/// and how long it took after the kill.
fn peer_killed_run(env: &Env, via: Via, survivor: Survivor, io: &str) -> (End, Duration) {
    let mut run = Run::new(
        env,
        format!("{survivor:?} ({io}) of a killed peer, {}", via.name()),
    );
    let (sdir, vdir) = match survivor {
        Survivor::Reader => ("recv", "send"),
        Survivor::Writer => ("send", "recv"),
    };
    let report = 4 << 20;
    let args = [
        "role=listen".to_owned(),
        format!("dir={sdir}"),
        format!("io={io}"),
        format!("report={report}"),
    ];
    let (s, port) = listening(&mut run, "survivor", via.peer(env, &args));
    let args = [
        "role=connect".to_owned(),
        "host=127.0.0.1".to_owned(),
        format!("port={port}"),
        format!("dir={vdir}"),
    ];
    let v = run.spawn("victim", via.peer(env, &args), true);
    let (spid, sfd) = pid_fd(&run.line(s, "connected "));
    let (vpid, vfd) = pid_fd(&run.line(v, "connected "));
    if via.mode() == Mode::Sdp {
        assert_sdp(env, "the survivor's connection", spid, sfd);
        assert_sdp(env, "the victim's connection", vpid, vfd);
    }
    run.line(s, "progress ");
    // Killed mid-copy: the bytes keep moving until the victim dies.
    via.wait_for_path(env, "the survivor's connection", spid, sfd);
    run.kill(v);
    let killed = Instant::now();
    let end = End::parse(&run.line(s, "end "));
    let took = killed.elapsed();
    run.check(end.ok && end.bad_at == -1, || {
        format!("a wrong byte was delivered: {end:?}")
    });
    run.check(end.bytes >= report, || format!("too few bytes: {end:?}"));
    (end, took)
}

/// The case over plain TCP and preloaded on each path; the survivor's
/// outcome must be one of `allowed` every time.
fn peer_killed(survivor: Survivor, io: &str, allowed: &[&str]) {
    let env = Env::new(&format!("faults-killed-{io}"));
    let mut seen = Vec::new();
    for via in Via::ALL {
        let (end, took) = peer_killed_run(&env, via, survivor, io);
        eprintln!(
            "{survivor:?} ({io}), peer killed, {}: {} after {} bytes, {took:?} after the kill",
            via.name(),
            end.outcome,
            end.bytes
        );
        assert!(
            allowed.contains(&end.outcome.as_str()),
            "{survivor:?} ({io}), {}: {end:?}, expected one of {allowed:?}",
            via.name()
        );
        seen.push(end.outcome);
    }
    eprintln!(
        "plain TCP {}, same-host path {}, wire path {}",
        seen[0], seen[1], seen[2]
    );
}

const READER_SEES: &[&str] = &["EOF", "ECONNRESET"];
const WRITER_SEES: &[&str] = &["EPIPE", "ECONNRESET"];

#[test]
fn peer_killed_mid_transfer_reader_blocking_gets_eof_or_reset() {
    peer_killed(Survivor::Reader, "block", READER_SEES);
}

#[test]
fn peer_killed_mid_transfer_reader_nonblocking_gets_eof_or_reset() {
    peer_killed(Survivor::Reader, "poll", READER_SEES);
}

#[test]
fn peer_killed_mid_transfer_reader_epoll_gets_eof_or_reset() {
    peer_killed(Survivor::Reader, "epoll", READER_SEES);
}

#[test]
fn peer_killed_mid_transfer_writer_blocking_gets_epipe_or_reset() {
    peer_killed(Survivor::Writer, "block", WRITER_SEES);
}

#[test]
fn peer_killed_mid_transfer_writer_nonblocking_gets_epipe_or_reset() {
    peer_killed(Survivor::Writer, "poll", WRITER_SEES);
}

#[test]
fn peer_killed_mid_transfer_writer_epoll_gets_epipe_or_reset() {
    peer_killed(Survivor::Writer, "epoll", WRITER_SEES);
}

// ---------------------------------------------------------------------
// 2. A close with unread data; a shutdown of one direction.

/// The writer (`io`) sends until the reader, having read 8 MiB (by then
/// the bytes take the path `via` names) and seen more readable, closes
/// with it unread (TCP: a reset).
fn close_unread_run(env: &Env, via: Via, io: &str) -> End {
    let mut run = Run::new(
        env,
        format!("writer ({io}) of a close with unread data, {}", via.name()),
    );
    let unread_after = 8 << 20;
    let args = [
        "role=listen".to_owned(),
        "dir=recv".to_owned(),
        format!("close_unread={unread_after}"),
        // Held once it read that much, until the export was read: a fast
        // reader would close (and its record go) before.
        format!("report={unread_after}"),
        "stall=1".to_owned(),
    ];
    let (r, port) = listening(&mut run, "closing reader", via.peer(env, &args));
    let args = [
        "role=connect".to_owned(),
        "host=127.0.0.1".to_owned(),
        format!("port={port}"),
        "dir=send".to_owned(),
        format!("io={io}"),
    ];
    let w = run.spawn("writer", via.peer(env, &args), true);
    let (rpid, rfd) = pid_fd(&run.line(r, "connected "));
    let (wpid, wfd) = pid_fd(&run.line(w, "connected "));
    if via.mode() == Mode::Sdp {
        assert_sdp(env, "the reader's connection", rpid, rfd);
        assert_sdp(env, "the writer's connection", wpid, wfd);
    }
    run.line(r, "progress ");
    via.wait_for_path(env, "the reader's connection", rpid, rfd);
    run.procs[r].send("go\n");
    let closing = run.line(r, "closing ");
    run.check(closing.ends_with("unread True ok True"), || {
        format!("the reader should close with bytes unread, all it read right: {closing:?}")
    });
    let end = End::parse(&run.line(w, "end "));
    run.check(WRITER_SEES.contains(&end.outcome.as_str()), || {
        format!("the writer should get EPIPE or ECONNRESET: {end:?}")
    });
    end
}

/// The case over plain TCP and preloaded on each path. The reader's close
/// sends RST while the writer's connection is established, so Linux TCP
/// gives the writer ECONNRESET (`tcp_reset`; EPIPE only after a FIN, in
/// CLOSE_WAIT), and the first failing send reports it: the preloaded
/// writer must see the same.
fn close_unread(io: &str) {
    let env = Env::new(&format!("faults-close-unread-{io}"));
    let ends = Via::ALL.map(|via| (via, close_unread_run(&env, via, io)));
    for (via, end) in &ends {
        eprintln!(
            "writer ({io}) of a close with unread data, {}: {} after {} bytes",
            via.name(),
            end.outcome,
            end.bytes
        );
    }
    assert_eq!(
        ends[0].1.outcome, "ECONNRESET",
        "plain TCP: {:?}",
        ends[0].1
    );
    for (via, end) in &ends[1..] {
        assert_eq!(
            end.outcome,
            ends[0].1.outcome,
            "writer ({io}) of a close with unread data, {}: {end:?}, plain TCP {:?}",
            via.name(),
            ends[0].1
        );
    }
}

#[test]
fn peer_closes_with_unread_data_blocking_writer_gets_econnreset() {
    close_unread("block");
}

#[test]
fn peer_closes_with_unread_data_epoll_writer_gets_econnreset() {
    close_unread("epoll");
}

/// Both directions at once. `shut=1`: sends `first` bytes, shuts its
/// write side down, tries one more send (EPIPE), reads the peer's stream
/// to its end. `shut=0`: sends `first` bytes while it reads the peer's
/// stream to its end, then reads once more (EOF again) and sends `after`
/// bytes more, then closes. Each checks every byte it reads; prints
/// `connected PID FD` and `end ...`.
const HALF_CLOSE: &str = r#"
import errno, os, random, socket, sys, threading
args = dict(a.split("=", 1) for a in sys.argv[1:])
shut = args["shut"] == "1"
P = (1 << 20) + 7
def pattern(seed):
    p = random.Random(seed).randbytes(P)
    return p + p
out2, in2 = pattern(int(args["seed_out"])), pattern(int(args["seed_in"]))
if args["role"] == "listen":
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    print("listening", srv.getsockname()[1], os.getpid(), flush=True)
    s, _ = srv.accept()
else:
    s = socket.create_connection(("127.0.0.1", int(args["port"])))
print("connected", os.getpid(), s.fileno(), flush=True)
got = {"n": 0, "ok": True}
def reader():
    while True:
        d = s.recv(1 << 18)
        if not d:
            return
        off = got["n"] % P
        got["ok"] = got["ok"] and d == in2[off:off + len(d)]
        got["n"] += len(d)
t = threading.Thread(target=reader)
t.start()
sent = 0
def send(n):
    global sent
    while n > 0:
        off, k = sent % P, min(n, 65536)
        s.sendall(out2[off:off + k])
        sent, n = sent + k, n - k
send(int(args["first"]))
if shut:
    s.shutdown(socket.SHUT_WR)
    try:
        s.send(b"x", socket.MSG_NOSIGNAL)
        after_shutdown = "sent"
    except OSError as e:
        after_shutdown = errno.errorcode[e.errno]
    t.join()
    print("end shut sent", sent, "received", got["n"], "ok", got["ok"],
          "send_after_shutdown", after_shutdown, flush=True)
else:
    t.join()
    again = s.recv(100)
    send(int(args["after"]))
    s.close()
    print("end other sent", sent, "received", got["n"], "ok", got["ok"],
          "eof_again", again == b"", flush=True)
"#;

fn half_close_run(env: &Env, via: Via) -> (String, String) {
    let mut run = Run::new(env, format!("SHUT_WR, {}", via.name()));
    let first = 3 << 20;
    let (other_first, other_after) = (2 << 20, 3 << 20);
    let mut cmd = via.python(env, HALF_CLOSE);
    cmd.args(["role=listen", "shut=0", "seed_out=21", "seed_in=12"])
        .arg(format!("first={other_first}"))
        .arg(format!("after={other_after}"));
    let o = run.spawn("other", cmd, true);
    let port: u16 = words(&run.line(o, "listening "))[0].parse().unwrap();
    let mut cmd = via.python(env, HALF_CLOSE);
    cmd.args(["role=connect", "shut=1", "seed_out=12", "seed_in=21"])
        .arg(format!("port={port}"))
        .arg(format!("first={first}"));
    let h = run.spawn("shutter", cmd, true);
    let (opid, ofd) = pid_fd(&run.line(o, "connected "));
    let (hpid, hfd) = pid_fd(&run.line(h, "connected "));
    if via.mode() == Mode::Sdp {
        assert_sdp(env, "the accepting side", opid, ofd);
        assert_sdp(env, "the side that shuts down", hpid, hfd);
    }
    // The shutter's end first: the other's bytes may still be in its
    // process (SDP) when it prints its own.
    let shutter = run.line(h, "end ");
    let other = run.line(o, "end ");
    let want_shutter = format!(
        "end shut sent {first} received {} ok True send_after_shutdown EPIPE",
        other_first + other_after
    );
    let want_other = format!(
        "end other sent {} received {first} ok True eof_again True",
        other_first + other_after
    );
    run.check(shutter == want_shutter, || {
        format!("the shutter: {shutter:?}, expected {want_shutter:?}")
    });
    run.check(other == want_other, || {
        format!("the other side: {other:?}, expected {want_other:?}")
    });
    (shutter, other)
}

#[test]
fn peer_shuts_down_one_direction_other_direction_keeps_working() {
    let env = Env::new("faults-shut-wr");
    let plain = half_close_run(&env, Via::Tcp);
    for via in [Via::Local, Via::Wire] {
        assert_eq!(plain, half_close_run(&env, via), "{}", via.name());
    }
}

// ---------------------------------------------------------------------
// 3. The port mapper killed, and restarted.

/// An echo server with as many listeners as it is asked for: each line
/// `listen` on standard input opens one on 127.0.0.1 and prints
/// `listening PORT`.
const MULTI_SERVER: &str = r#"
import os, socket, sys, threading
def serve(c):
    while True:
        d = c.recv(1 << 16)
        if not d:
            break
        c.sendall(d)
    c.close()
def accept(srv):
    while True:
        c, _ = srv.accept()
        threading.Thread(target=serve, args=(c,), daemon=True).start()
print("pid", os.getpid(), flush=True)
for line in sys.stdin:
    if line.strip() == "listen":
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen(16)
        threading.Thread(target=accept, args=(srv,), daemon=True).start()
        print("listening", srv.getsockname()[1], flush=True)
"#;

/// A client of many connections, by lines on standard input:
/// `connect PORT` connects (blocking) and prints `connected PORT FD`;
/// `echo FD SIZE` sends SIZE more bytes of the pattern on connection FD
/// while it reads them back, and prints `echo FD SIZE ok BOOL`.
const MULTI_CLIENT: &str = r#"
import os, random, socket, sys, threading
P = (1 << 20) + 7
pat = random.Random(7).randbytes(P)
pat2 = pat + pat
conns = {}
print("pid", os.getpid(), flush=True)
for line in sys.stdin:
    w = line.split()
    if w[0] == "connect":
        c = socket.create_connection(("127.0.0.1", int(w[1])))
        conns[c.fileno()] = [c, 0]
        print("connected", w[1], c.fileno(), flush=True)
    elif w[0] == "echo":
        fd, size = int(w[1]), int(w[2])
        c, start = conns[fd]
        def send():
            n = start
            while n < start + size:
                off, k = n % P, min(start + size - n, 65536)
                c.sendall(pat2[off:off + k])
                n += k
        t = threading.Thread(target=send)
        t.start()
        n, ok = start, True
        while n < start + size:
            d = c.recv(1 << 18)
            if not d:
                ok = False
                break
            off = n % P
            ok = ok and d == pat2[off:off + len(d)]
            n += len(d)
        t.join()
        conns[fd][1] = n
        print("echo", fd, size, "ok", ok, flush=True)
"#;

/// [`MULTI_SERVER`] and its pid.
fn multi_server(run: &mut Run, mode: Mode) -> (usize, u32) {
    let i = run.spawn("server", run.env.python(MULTI_SERVER, mode), true);
    let pid = words(&run.line(i, "pid "))[0].parse().unwrap();
    (i, pid)
}

/// A new listener of the server: its port.
fn listen(run: &mut Run, server: usize) -> u16 {
    run.procs[server].send("listen\n");
    words(&run.line(server, "listening "))[0].parse().unwrap()
}

/// [`MULTI_CLIENT`] (pointed at `pm_port`) and its pid.
fn multi_client(run: &mut Run, name: &str, pm_port: u16) -> (usize, u32) {
    let mut cmd = run.env.python(MULTI_CLIENT, Mode::Sdp);
    cmd.env("SDP_PM_PORT", pm_port.to_string());
    let i = run.spawn(name, cmd, true);
    let pid = words(&run.line(i, "pid "))[0].parse().unwrap();
    (i, pid)
}

/// Connects the client to `port`, moves 256 KiB there and back, and
/// returns the connection's record.
fn connect_echo(run: &mut Run, client: usize, pid: u32, port: u16) -> (usize, Record) {
    run.procs[client].send(&format!("connect {port}\n"));
    let fd: usize = words(&run.line(client, "connected "))[1].parse().unwrap();
    echo(run, client, fd);
    let r = run
        .env
        .wait_records("the client's connection", pid, 1, |r| r.fd == fd);
    (fd, r[0].clone())
}

fn echo(run: &mut Run, client: usize, fd: usize) {
    run.procs[client].send(&format!("echo {fd} 262144\n"));
    let l = run.line(client, &format!("echo {fd} "));
    run.check(l.ends_with("ok True"), || {
        format!("the echo differs: {l:?}")
    });
}

/// SIGKILL to the test's port mapper (its UDP port is closed at once: a
/// query there gets ICMP port unreachable).
fn kill_port_mapper(env: &Env) {
    // SAFETY: kill has no memory preconditions; the daemon is the Env's
    // child, not yet waited for.
    unsafe { libc::kill(env.pm.pid() as libc::pid_t, libc::SIGKILL) };
    let deadline = Instant::now() + CASE_LIMIT;
    while e2e::running(env.pm.pid()) {
        assert!(Instant::now() < deadline, "the port mapper does not die");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A port mapper daemon on `port` (0: any) with control socket `control`,
/// in `ns`'s namespace when given; killed on drop.
struct Daemon {
    port: u16,
    _proc: Proc,
}

impl Daemon {
    fn start(port: u16, control: &Path, ns: Option<(&NetPair, Side)>) -> Daemon {
        let mut cmd = Command::new(&preload::artifacts().portmapper);
        cmd.args(["--port", &port.to_string(), "--stats-interval-ms", "0"])
            .args(["--log-level", "warn", "--control"])
            .arg(control);
        if let Some((pair, side)) = ns {
            pair.enter(side, &mut cmd);
        }
        let mut p = Proc::spawn("sdp-portmapper", cmd, false);
        let line = p
            .try_wait_line(CASE_LIMIT, |l| l.starts_with("ready "))
            .unwrap_or_else(|w| panic!("sdp-portmapper: {w:?}\n{}", p.transcript()));
        let port = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("udp="))
            .and_then(|list| list.split(',').next())
            .and_then(|a| a.parse::<SocketAddr>().ok())
            .map(|a| a.port())
            .unwrap_or_else(|| panic!("no UDP port in {line:?}"));
        Daemon { port, _proc: p }
    }
}

#[test]
fn port_mapper_killed_before_connect_falls_back_with_a_port_mapper_reason() {
    if !sdp_expected("port mapper killed before a connect") {
        return;
    }
    let env = Env::new("faults-pm-killed-before");
    let mut run = Run::new(&env, "port mapper killed before a connect");
    let (server, spid) = multi_server(&mut run, Mode::Sdp);
    let port = listen(&mut run, server);
    env.wait_listener(spid, port);
    kill_port_mapper(&env);
    let (client, cpid) = multi_client(&mut run, "client", env.pm.port);
    let (_, r) = connect_echo(&mut run, client, cpid, port);
    expect_tcp(
        "a connect after the port mapper died",
        &r,
        field::REASON_PM_UNREACHABLE,
    );
}

/// The daemon dies in the middle of a connect's transaction: it has the
/// PMReq (its answers are withheld, so the transaction is open), then it
/// is killed. The connect falls back to TCP within the port mapper
/// client's budget (its retransmissions find nothing) and works.
#[test]
fn port_mapper_killed_during_a_connect_falls_back_in_bounded_time() {
    if !sdp_expected("port mapper killed during a connect") {
        return;
    }
    let env = Env::new("faults-pm-killed-mid-connect");
    let proxy = UdpProxy::start(UdpProxyConfig {
        upstream: SocketAddr::from(([127, 0, 0, 1], env.pm.port)),
        drop_percent: 0,
        seed: 0x5eed_0003,
        redirect: None,
        withhold_answers: true,
    });
    let mut run = Run::new(&env, "port mapper killed during a connect");
    let (server, spid) = multi_server(&mut run, Mode::Sdp);
    let port = listen(&mut run, server);
    env.wait_listener(spid, port);
    let (client, cpid) = multi_client(&mut run, "client", proxy.port);
    let started = Instant::now();
    run.procs[client].send(&format!("connect {port}\n"));
    // The daemon has the query: kill it mid-transaction.
    let deadline = Instant::now() + CASE_LIMIT;
    while proxy.stats().to_daemon == 0 {
        assert!(Instant::now() < deadline, "no PMReq reached the daemon");
        std::thread::sleep(Duration::from_millis(1));
    }
    kill_port_mapper(&env);
    let fd: usize = words(&run.line(client, "connected "))[1].parse().unwrap();
    let took = started.elapsed();
    echo(&mut run, client, fd);
    let r = env.wait_records("the client's connection", cpid, 1, |r| r.fd == fd);
    expect_tcp(
        "a connect whose port mapper died mid-transaction",
        &r[0],
        field::REASON_PM_TIMEOUT,
    );
    // The client's budget for an unanswered query (docs/portmapper.md).
    assert!(took < Duration::from_secs(3), "the connect took {took:?}");
}

#[test]
fn port_mapper_killed_with_connections_open_leaves_them_moving_data() {
    if !sdp_expected("port mapper killed during a run") {
        return;
    }
    let env = Env::new("faults-pm-killed-during");
    let mut run = Run::new(&env, "port mapper killed during a run");
    let (server, spid) = multi_server(&mut run, Mode::Sdp);
    let port = listen(&mut run, server);
    env.wait_listener(spid, port);
    let (client, cpid) = multi_client(&mut run, "client", env.pm.port);
    let (fd1, r1) = connect_echo(&mut run, client, cpid, port);
    let (fd2, r2) = connect_echo(&mut run, client, cpid, port);
    expect_sdp("the first connection", &r1);
    expect_sdp("the second connection", &r2);
    kill_port_mapper(&env);
    for _ in 0..3 {
        echo(&mut run, client, fd1);
        echo(&mut run, client, fd2);
    }
    // Still the same SDP connections, with every byte counted there.
    for fd in [fd1, fd2] {
        let r = env.wait_records("the connection after the kill", cpid, 1, |r| {
            r.fd == fd && r.counters[0] >= 4 * 262_144
        });
        expect_sdp("a connection after the port mapper died", &r[0]);
    }
}

#[test]
fn port_mapper_restarted_on_the_same_port_gets_every_listener_registered_again() {
    if !sdp_expected("port mapper restarted") {
        return;
    }
    let env = Env::new("faults-pm-restarted");
    let mut run = Run::new(&env, "port mapper killed and restarted");
    let (server, spid) = multi_server(&mut run, Mode::Sdp);
    let p1 = listen(&mut run, server);
    env.wait_listener(spid, p1);
    let (old, old_pid) = multi_client(&mut run, "old client", env.pm.port);
    let (_, r) = connect_echo(&mut run, old, old_pid, p1);
    expect_sdp("P1 with the port mapper up", &r);

    kill_port_mapper(&env);
    // No port mapper: P2 is not registered yet.
    let p2 = listen(&mut run, server);
    // The PMAccept for P1 is cached for its PmTime (30 s): SDP still.
    let (_, r) = connect_echo(&mut run, old, old_pid, p1);
    expect_sdp("P1 from the cached PMAccept", &r);
    // P2 was never asked: ICMP unreachable, which the client remembers
    // for the host (30 s) and which drops the host's cached PMAccepts.
    let (_, r) = connect_echo(&mut run, old, old_pid, p2);
    expect_tcp("P2 without a port mapper", &r, field::REASON_PM_UNREACHABLE);

    let _restarted = Daemon::start(env.pm.port, &env.pm.control, None);
    let p3 = listen(&mut run, server);
    env.wait_listener(spid, p3);
    // The server registers P1 (whose registration died with the old
    // daemon) and P2 (made while none answered) with the new one.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let registered = |port: u16| format!(" port={port} ");
    loop {
        let list = env.pm.list();
        if [p1, p2, p3].iter().all(|&p| list.contains(&registered(p))) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "P1 {p1}, P2 {p2}, P3 {p3} not all registered again:\n{list}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // The old client still holds "no port mapper on this host".
    let (_, r) = connect_echo(&mut run, old, old_pid, p3);
    expect_tcp(
        "P3 from the old client's negative cache",
        &r,
        field::REASON_PM_UNREACHABLE,
    );
    // A new client asks the new port mapper: SDP for every listener,
    // the ones from before the restart too.
    let (new, new_pid) = multi_client(&mut run, "new client", env.pm.port);
    for (what, p) in [("P1", p1), ("P2", p2), ("P3", p3)] {
        let (_, r) = connect_echo(&mut run, new, new_pid, p);
        expect_sdp(&format!("{what} from a new client"), &r);
    }
}

// ---------------------------------------------------------------------
// 4. Port mapper datagrams lost.

#[test]
fn port_mapper_losing_30_percent_of_datagrams_still_decides_every_connection() {
    if !sdp_expected("port mapper datagrams lost") {
        return;
    }
    const CLIENTS: usize = 10;
    let env = Env::new("faults-pm-loss");
    let proxy = UdpProxy::start(UdpProxyConfig {
        upstream: SocketAddr::from(([127, 0, 0, 1], env.pm.port)),
        drop_percent: 30,
        seed: 0x5eed_0004,
        redirect: None,
        withhold_answers: false,
    });
    let mut run = Run::new(&env, "30 % of the port mapper's datagrams lost");
    let s = run.spawn("echo server", env.python(ECHO_SERVER, Mode::Sdp), false);
    let l = run.line(s, "listening ");
    let (port, spid): (u16, u32) = (words(&l)[0].parse().unwrap(), words(&l)[1].parse().unwrap());
    env.wait_listener(spid, port);
    let (mut sdp, mut tcp) = (0, Vec::new());
    // One process per connection: each asks with an empty cache (a
    // process remembers an unanswered query for 30 s, per host).
    for seed in 0..CLIENTS {
        let mut cmd = env.python(ECHO_CLIENT, Mode::Sdp);
        cmd.env("SDP_PM_PORT", proxy.port.to_string()).args([
            "127.0.0.1".to_owned(),
            port.to_string(),
            seed.to_string(),
            "300000".to_owned(),
        ]);
        let c = run.spawn("echo client", cmd, true);
        let l = run.line(c, "echo ");
        let w = words(&l);
        run.check(w[0] == "True", || format!("the echo differs: {l:?}"));
        let (pid, fd): (u32, usize) = (w[1].parse().unwrap(), w[2].parse().unwrap());
        let r = env.wait_records("a client's connection", pid, 1, |r| r.fd == fd);
        match r[0].transport {
            field::SDP => sdp += 1,
            _ => {
                expect_tcp(
                    "a connection whose port mapper answers were lost",
                    &r[0],
                    field::REASON_PM_TIMEOUT,
                );
                tcp.push(r[0].reason);
            }
        }
        run.procs[c].close_stdin();
    }
    let stats = proxy.stats();
    eprintln!(
        "{CLIENTS} connections: {sdp} SDP, {} TCP (port mapper timeout); proxy: {stats:?}",
        tcp.len()
    );
    assert!(
        stats.dropped_to_daemon + stats.dropped_to_client > 0,
        "nothing was dropped: {stats:?}"
    );
    // Each PMReq round trip survives with p = 0.49, five PMReqs are sent:
    // a connection falls back with p ≈ 0.035.
    assert!(sdp * 2 > CLIENTS, "{sdp} of {CLIENTS} SDP: {stats:?}");
}

// ---------------------------------------------------------------------
// 5. One byte of an FPDU flipped in flight.

/// The hidden SDP port Q of the server's port `p`, from the port mapper's
/// registrations.
fn sdp_port(env: &Env, p: u16) -> u16 {
    let list = env.pm.list();
    list.lines()
        .filter(|l| l.starts_with("registration "))
        .find(|l| l.split_whitespace().any(|w| w == format!("port={p}")))
        .and_then(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("sdp_port="))
                .and_then(|q| q.parse().ok())
        })
        .unwrap_or_else(|| panic!("no registration of port {p}:\n{list}"))
}

/// The writer sends the pattern through a [`TcpProxy`] that flips one
/// byte of an FPDU towards the reader after 2 MiB; with `pause`, the
/// corrupted FPDU comes right behind a whole message, to a reader that
/// waits (see [`Corrupt`]).
fn corrupted_fpdu(tag: &str, pause: Option<Duration>) {
    if !sdp_expected("a corrupted FPDU") {
        return;
    }
    let env = Env::new(tag);
    let mut run = Run::new(&env, format!("one FPDU byte flipped (pause {pause:?})"));
    // The flip is aimed at payload on the wire: both ends keep it there
    // (the same-host path would carry it outside the TCP connection).
    let mut reader = peer(&env, Mode::Sdp, &["role=listen".into(), "dir=recv".into()]);
    reader.env("SDP_LOCAL", "off");
    let (r, port) = listening(&mut run, "reader", reader);
    let q = sdp_port(&env, port);
    let tcp = TcpProxy::start(
        SocketAddr::from(([127, 0, 0, 1], q)),
        Some(Corrupt {
            after: 2 << 20,
            min_ulpdu: 1024,
            xor: 0x5a,
            pause,
        }),
    );
    let udp = UdpProxy::start(UdpProxyConfig {
        upstream: SocketAddr::from(([127, 0, 0, 1], env.pm.port)),
        drop_percent: 0,
        seed: 5,
        redirect: Some(tcp.port),
        withhold_answers: false,
    });
    let mut cmd = peer(
        &env,
        Mode::Sdp,
        &[
            "role=connect".into(),
            "host=127.0.0.1".into(),
            format!("port={port}"),
            "dir=send".into(),
        ],
    );
    cmd.env("SDP_PM_PORT", udp.port.to_string())
        .env("SDP_LOCAL", "off");
    let w = run.spawn("writer", cmd, true);
    let (rpid, rfd) = pid_fd(&run.line(r, "connected "));
    let (wpid, wfd) = pid_fd(&run.line(w, "connected "));
    assert_sdp(&env, "the reader's connection", rpid, rfd);
    assert_sdp(
        &env,
        "the writer's connection (through the proxy)",
        wpid,
        wfd,
    );
    let reader = End::parse(&run.line(r, "end "));
    let writer = End::parse(&run.line(w, "end "));
    let report = tcp.report();
    eprintln!("reader: {reader:?}\nwriter: {writer:?}\nproxy: {report:?}");
    let flip = report
        .flip
        .unwrap_or_else(|| run.fail("the proxy flipped no byte"));
    run.check(reader.ok && reader.bad_at == -1, || {
        format!("a wrong byte reached the reader: {reader:?}")
    });
    // The reader's bytes all came from FPDUs before the corrupted one.
    run.check(reader.bytes < flip.stream_offset, || {
        format!(
            "the reader got {} bytes, the flip was at stream byte {}",
            reader.bytes, flip.stream_offset
        )
    });
    // The project's choice for a Terminate: ECONNRESET (sdp-core
    // conn::on_transport_error: ErrorKind::Terminated → ConnectionReset).
    run.check(reader.outcome == "ECONNRESET", || {
        format!("the reader should get ECONNRESET: {reader:?}")
    });
    run.check(WRITER_SEES.contains(&writer.outcome.as_str()), || {
        format!("the writer should get ECONNRESET or EPIPE: {writer:?}")
    });
    // The receiver reports the CRC error in a Terminate (RFC 5040 §4.8):
    // Layer LLP, Error Type MPA, Error Code 2 (RFC 5044 §8).
    let crc = sdp_tests::proxy::Terminate {
        layer: 0x2,
        etype: 0x0,
        code: 0x02,
    };
    run.check(report.terminates_from_server.contains(&crc), || {
        format!("no MPA CRC Terminate from the server: {report:?}")
    });
    run.check(report.unparsed.is_empty(), || format!("{report:?}"));
    if pause.is_some() {
        run.check(flip.delivered_with > 0, || {
            format!("no whole message came with the corrupted FPDU: {flip:?}")
        });
    }
}

#[test]
fn a_corrupted_fpdu_ends_the_connection_with_an_error_and_no_wrong_byte() {
    corrupted_fpdu("faults-corrupt", None);
}

#[test]
fn a_corrupted_fpdu_behind_a_message_to_a_waiting_reader_ends_it_with_an_error() {
    corrupted_fpdu("faults-corrupt-waiting", Some(Duration::from_millis(200)));
}

// ---------------------------------------------------------------------
// 6. A reset, and silence, on the SDP port.

/// A TCP port on 127.0.0.1 where nothing listens now: a connect gets RST.
fn closed_tcp_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a TCP port")
        .port()
}

#[test]
fn a_reset_on_the_sdp_port_falls_back_to_tcp_and_works() {
    if !sdp_expected("RST on the SDP port") {
        return;
    }
    let env = Env::new("faults-sdp-rst");
    let mut run = Run::new(&env, "RST on the SDP port");
    let s = run.spawn("echo server", env.python(ECHO_SERVER, Mode::Sdp), false);
    let l = run.line(s, "listening ");
    let (port, spid): (u16, u32) = (words(&l)[0].parse().unwrap(), words(&l)[1].parse().unwrap());
    env.wait_listener(spid, port);
    let udp = UdpProxy::start(UdpProxyConfig {
        upstream: SocketAddr::from(([127, 0, 0, 1], env.pm.port)),
        drop_percent: 0,
        seed: 6,
        redirect: Some(closed_tcp_port()),
        withhold_answers: false,
    });
    let mut cmd = env.python(ECHO_CLIENT, Mode::Sdp);
    cmd.env("SDP_PM_PORT", udp.port.to_string()).args([
        "127.0.0.1",
        &port.to_string(),
        "6",
        "300000",
    ]);
    let c = run.spawn("echo client", cmd, true);
    let l = run.line(c, "echo ");
    let w = words(&l);
    run.check(w[0] == "True", || format!("the echo differs: {l:?}"));
    let (pid, fd): (u32, usize) = (w[1].parse().unwrap(), w[2].parse().unwrap());
    let r = env.wait_records("the client's connection", pid, 1, |r| r.fd == fd);
    expect_tcp("a connect reset on the SDP port", &r[0], field::REASON_RST);
    run.check(udp.stats().redirected >= 1, || format!("{:?}", udp.stats()));
}

/// Connects to `PORT` (`block`: a blocking connect; `nonblock`: connect,
/// then `poll` for writable), timing it; then one echo of 64 KiB. Prints
/// `connect ms N so_error N echo BOOL PID FD`.
const TIMED_CONNECT: &str = r#"
import os, random, select, socket, sys, time
port, how = int(sys.argv[1]), sys.argv[2]
c = socket.socket()
t = time.monotonic()
if how == "block":
    c.connect(("127.0.0.1", port))
else:
    c.setblocking(False)
    c.connect_ex(("127.0.0.1", port))
    p = select.poll()
    p.register(c, select.POLLOUT)
    p.poll(30000)
    c.setblocking(True)
ms = int((time.monotonic() - t) * 1000)
err = c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
data = random.Random(port).randbytes(65536)
c.sendall(data)
got = b""
while len(got) < len(data):
    d = c.recv(1 << 16)
    if not d:
        break
    got += d
print("connect ms", ms, "so_error", err, "echo", got == data, os.getpid(), c.fileno(), flush=True)
sys.stdin.read()
"#;

#[test]
fn a_silent_sdp_listener_falls_back_within_the_startup_timeout() {
    if !sdp_expected("a silent SDP listener") {
        return;
    }
    let env = Env::new("faults-sdp-silent");
    let mut run = Run::new(&env, "an MPA Reply that never comes");
    let s = run.spawn("echo server", env.python(ECHO_SERVER, Mode::Sdp), false);
    let l = run.line(s, "listening ");
    let (port, spid): (u16, u32) = (words(&l)[0].parse().unwrap(), words(&l)[1].parse().unwrap());
    env.wait_listener(spid, port);
    // Accepts and keeps every connection, says nothing.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for c in silent.incoming().flatten() {
            held.push(c);
        }
    });
    let udp = UdpProxy::start(UdpProxyConfig {
        upstream: SocketAddr::from(([127, 0, 0, 1], env.pm.port)),
        drop_percent: 0,
        seed: 6,
        redirect: Some(silent_port),
        withhold_answers: false,
    });
    // Both kinds of connect at once (each waits for the startup timer);
    // several nonblocking ones, which the fallback's setup in the
    // background races with the program's next calls.
    let mut clients = Vec::new();
    for how in ["block", "nonblock", "nonblock", "nonblock", "nonblock"] {
        let mut cmd = env.python(TIMED_CONNECT, Mode::Sdp);
        cmd.env("SDP_PM_PORT", udp.port.to_string())
            .args([&port.to_string(), how]);
        clients.push((how, run.spawn(how, cmd, true)));
    }
    for (how, c) in clients {
        let l = run.line(c, "connect ");
        let ms: u64 = value(&l, "ms");
        let w: Vec<&str> = l.split_whitespace().collect();
        eprintln!("{how} connect to a silent SDP port: {l}");
        run.check(
            value::<i32>(&l, "so_error") == 0 && value::<String>(&l, "echo") == "True",
            || format!("{how} connect: {l:?}"),
        );
        // docs/preload.md: at most the port mapper's 900 ms plus the MPA
        // startup timer (5 s); some room for a loaded machine.
        run.check(ms < 8_000, || format!("{how} connect took {ms} ms: {l:?}"));
        let (pid, fd): (u32, usize) = (
            w[w.len() - 2].parse().unwrap(),
            w[w.len() - 1].parse().unwrap(),
        );
        let r = env.wait_records("the client's connection", pid, 1, |r| r.fd == fd);
        expect_tcp("a connect with no MPA Reply", &r[0], field::REASON_TIMEOUT);
    }
}

// ---------------------------------------------------------------------
// 7. A link taken down between two hosts (network namespaces).

/// One run: the writer (server) on host B, the reader (client, blocking,
/// `opt`) on host A. Once 2 MiB arrived the reader stops reading, so that
/// the writer fills the connection, B's end of the link goes down, and
/// the reader goes on: it reads what it holds, then blocks. Returns the
/// reader's end and how long after the link went down (within `within`,
/// else the run fails as a hang).
fn link_down_run(env: &Env, mode: Mode, opt: &str, within: Duration) -> Option<(End, Duration)> {
    let pair = match NetPair::create("faults") {
        Ok(p) => p,
        Err(why) => {
            eprintln!("SKIPPED: two network namespaces are needed: {why}");
            return None;
        }
    };
    let mut run = Run::new(
        env,
        format!("link down, reader with {opt}, {}", mode_name(mode)),
    );
    let control = env.stat_dir().join(format!("pm-{}.sock", pair.ns[1]));
    let daemon = Daemon::start(0, &control, Some((&pair, Side::B)));
    let ns_env = |cmd: &mut Command| {
        cmd.env("SDP_PM_PORT", daemon.port.to_string())
            .env("SDP_PM_CONTROL", &control);
    };
    let mut cmd = peer(
        env,
        mode,
        &[
            "role=listen".into(),
            "host=0.0.0.0".into(),
            "dir=send".into(),
        ],
    );
    ns_env(&mut cmd);
    pair.enter(Side::B, &mut cmd);
    let (w, port) = listening(&mut run, "writer on B", cmd);
    let report = 2 << 20;
    let mut cmd = peer(
        env,
        mode,
        &[
            "role=connect".into(),
            format!("host={}", pair.addr(Side::B)),
            format!("port={port}"),
            "dir=recv".into(),
            format!("report={report}"),
            "stall=1".into(),
            opt.into(),
        ],
    );
    ns_env(&mut cmd);
    pair.enter(Side::A, &mut cmd);
    let r = run.spawn("reader on A", cmd, true);
    let (wpid, wfd) = pid_fd(&run.line(w, "connected "));
    let (rpid, rfd) = pid_fd(&run.line(r, "connected "));
    if mode == Mode::Sdp {
        assert_sdp(env, "the writer's connection", wpid, wfd);
        assert_sdp(env, "the reader's connection", rpid, rfd);
    }
    run.line(r, "progress ");
    pair.link_down(Side::B);
    let down = Instant::now();
    run.procs[r].send("go\n");
    let end = End::parse(&run.line_within(r, "end ", within));
    let took = down.elapsed();
    run.check(end.ok && end.bad_at == -1, || {
        format!("a wrong byte was delivered: {end:?}")
    });
    // The programs, then the port mapper, go before the namespaces.
    drop(run);
    drop(daemon);
    drop(pair);
    Some((end, took))
}

fn link_down(opt: &str, want: &str, within: Duration) {
    let env = Env::new("faults-link-down");
    for mode in [Mode::Plain, Mode::Sdp] {
        let Some((end, took)) = link_down_run(&env, mode, opt, within) else {
            return;
        };
        eprintln!(
            "link down, blocked reader with {opt}, {}: {} after {} bytes, {took:?} after the link went down",
            mode_name(mode),
            end.outcome,
            end.bytes
        );
        assert_eq!(
            end.outcome,
            want,
            "blocked reader with {opt}, {}: {end:?}",
            mode_name(mode)
        );
        assert!(
            took < within,
            "{}: {took:?} after the link went down (at most {within:?})",
            mode_name(mode)
        );
    }
}

#[test]
fn link_down_mid_transfer_keepalive_gives_the_blocked_reader_etimedout() {
    // Idle 1 s, then 2 probes 1 s apart: ETIMEDOUT about 3 s after the
    // last segment. (Linux probes only a connection with nothing
    // unacknowledged, tcp_keepalive_timer; a TCP reader sends nothing but
    // ACKs. A sender's connection would wait for tcp_retries2 instead.)
    link_down("keepalive=1,1,2", "ETIMEDOUT", Duration::from_secs(10));
}

#[test]
fn link_down_mid_transfer_rcvtimeo_gives_the_blocked_reader_eagain() {
    link_down("rcvtimeo=1.5", "EAGAIN", Duration::from_secs(6));
}
