//! Acceptance 1 and 5 of the port mapper issue, against the real daemon on
//! loopback: accept, deny, registration checks, registration lifetime,
//! IPv6, timers, malformed datagrams; and the daemon as a service: shutdown
//! on SIGTERM, the settings file, reload on SIGHUP.

mod common;

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use common::{ip, port, Daemon, Registered};
use portmapper::client::{Decision, Fallback};
use portmapper::control::ControlClient;
use portmapper::net::PmClient;
use portmapper::wire::{MessageRepr, MsgType, PmTime};

fn raw_socket(d: &Daemon) -> UdpSocket {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.connect(("127.0.0.1", d.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

fn pmreq(ap: SocketAddr, cp: SocketAddr, handle: u64) -> MessageRepr {
    MessageRepr {
        mtype: MsgType::REQ,
        pm_time: PmTime::NO_CACHE,
        ap_port: ap.port(),
        cp_port: cp.port(),
        assoc_handle: handle,
        cp_addr: cp.ip(),
        ap_addr: ap.ip(),
    }
}

fn recv_msg(s: &UdpSocket) -> MessageRepr {
    let mut b = [0u8; 100];
    let n = s.recv(&mut b).unwrap();
    MessageRepr::parse_bytes(&b[..n]).unwrap()
}

#[test]
fn accept_for_registered_port() {
    let d = Daemon::start(&[]);
    let r = Registered::new(&d, "127.0.0.1");
    let pm = PmClient::new(d.client_config());
    let dec = pm.query(r.ap(), "127.0.0.1:0".parse().unwrap());
    assert_eq!(dec, Decision::Sdp(r.sdp()));
    // The PMAck completes the transaction: no state left.
    assert!(d.wait_for(Duration::from_secs(2), |d| d.stat("acks") == 1));
    assert_eq!(d.stat("pending"), 0);
    assert_eq!(d.stat("accepts"), 1);
    // The answer is usable: the SDP listener takes the connection.
    TcpStream::connect(r.sdp()).unwrap();
    // PmTime (30 s by default) lets the next connection skip the query.
    assert_eq!(
        pm.query(r.ap(), "127.0.0.1:0".parse().unwrap()),
        Decision::Sdp(r.sdp())
    );
    assert_eq!(d.stat("rx"), 2, "one PMReq and one PMAck");
}

#[test]
fn deny_for_unregistered_port() {
    let d = Daemon::start(&[]);
    let _r = Registered::new(&d, "127.0.0.1");
    let other = TcpListener::bind("127.0.0.1:0").unwrap();
    let pm = PmClient::new(d.client_config());
    let dec = pm.query(other.local_addr().unwrap(), "127.0.0.1:0".parse().unwrap());
    assert_eq!(dec, Decision::Tcp(Fallback::Denied));
    assert_eq!(d.stat("denies"), 1);
    assert_eq!(d.stat("pending"), 0);
    assert_eq!(d.stat("acks"), 0);
}

#[test]
fn registration_refused_unless_caller_listens() {
    let d = Daemon::start(&[]);
    let q = TcpListener::bind("127.0.0.1:0").unwrap();
    // Nobody listens on P.
    let free_p = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        port(&l)
    };
    let mut ctl = d.ctl();
    let e = ctl.register(ip("127.0.0.1"), free_p, port(&q)).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied);
    assert!(e.to_string().contains("does not listen"), "{e}");

    // Another process listens on P; we do not.
    let helper = Helper::spawn(&d, "127.0.0.1");
    let e = ctl
        .register(ip("127.0.0.1"), helper.p, port(&q))
        .unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied);
    // We listen on P but not on the claimed Q (the helper's).
    let p = TcpListener::bind("127.0.0.1:0").unwrap();
    let e = ctl
        .register(ip("127.0.0.1"), port(&p), helper.q)
        .unwrap_err();
    assert!(e.to_string().contains(&helper.q.to_string()), "{e}");
    // Right address matters too: listening on 127.0.0.1 is not on ::1.
    assert!(ctl.register(ip("::1"), port(&p), port(&q)).is_err());
    // And the real thing works on the same connection.
    ctl.register(ip("127.0.0.1"), port(&p), port(&q)).unwrap();

    let regs: Vec<String> = d
        .list()
        .into_iter()
        .filter(|l| l.starts_with("registration "))
        .collect();
    assert_eq!(regs.len(), 2, "{regs:?}"); // ours and the helper's
    assert!(d.log().contains("msg=register_refused"));
}

#[test]
fn registration_gone_after_process_killed() {
    let d = Daemon::start(&[]);
    let mut helper = Helper::spawn(&d, "127.0.0.1");
    let ap: SocketAddr = (ip("127.0.0.1"), helper.p).into();
    let pm = PmClient::new(portmapper::client::ClientConfig {
        // No caching, to see the daemon's answer each time.
        negative_ttl: Duration::ZERO,
        ..d.client_config()
    });
    assert_eq!(
        pm.query(ap, "127.0.0.1:0".parse().unwrap()),
        Decision::Sdp((ip("127.0.0.1"), helper.q).into())
    );
    pm.clear_cache();
    helper.child.kill().unwrap();
    helper.child.wait().unwrap();
    assert!(d.wait_for(Duration::from_secs(5), |d| d.stat("registrations") == 0));
    assert_eq!(
        pm.query(ap, "127.0.0.1:0".parse().unwrap()),
        Decision::Tcp(Fallback::Denied)
    );
    assert!(d.log().contains("reason=\"control connection closed\""));
}

#[test]
fn ipv6_end_to_end() {
    let d = Daemon::start(&[]);
    let r = Registered::new(&d, "::1");
    let pm = PmClient::new(d.client_config());
    let dec = pm.query(r.ap(), "[::]:0".parse().unwrap());
    assert_eq!(dec, Decision::Sdp(r.sdp()));
    assert!(matches!(dec, Decision::Sdp(SocketAddr::V6(_))));
    TcpStream::connect(r.sdp()).unwrap();
    assert!(d.wait_for(Duration::from_secs(2), |d| d.stat("acks") == 1));
    // An IPv4 request does not match a listener bound to ::1.
    let v4 = pm.query(
        (ip("127.0.0.1"), r.ap().port()).into(),
        "0.0.0.0:0".parse().unwrap(),
    );
    assert_eq!(v4, Decision::Tcp(Fallback::Denied));
}

#[test]
fn wildcard_listener_serves_any_address() {
    let d = Daemon::start(&[]);
    let r = Registered::new(&d, "0.0.0.0");
    let pm = PmClient::new(d.client_config());
    let ap: SocketAddr = (ip("127.0.0.1"), r.ap().port()).into();
    assert_eq!(
        pm.query(ap, "0.0.0.0:0".parse().unwrap()),
        Decision::Sdp((ip("127.0.0.1"), r.sdp().port()).into())
    );
}

#[test]
fn malformed_datagrams_dropped_and_counted() {
    let d = Daemon::start(&[]);
    let s = raw_socket(&d);
    let good = pmreq(
        "127.0.0.1:5001".parse().unwrap(),
        "127.0.0.1:4000".parse().unwrap(),
        1,
    )
    .to_bytes();
    let mut ver = good;
    ver[0] |= 0x80;
    let mut ipv = good;
    ipv[0] = (ipv[0] & 0xf0) | 0x5;
    let long = [&good[..], &[0u8; 20][..]].concat();
    for bad in [&good[..0], &good[..47], &long[..], &ver[..], &ipv[..]] {
        s.send(bad).unwrap();
    }
    // Stray replies and a PMAck with no state are discarded as well.
    for mt in [MsgType::ACCEPT, MsgType::DENY, MsgType::ACK] {
        let mut m = MessageRepr::parse_bytes(&good).unwrap();
        m.mtype = mt;
        s.send(&m.to_bytes()).unwrap();
    }
    // The daemon handles datagrams in order: if the first thing back is the
    // answer to this request, nothing before it was answered.
    let mut last = MessageRepr::parse_bytes(&good).unwrap();
    last.assoc_handle = 2;
    s.send(&last.to_bytes()).unwrap();
    let reply = recv_msg(&s);
    assert_eq!((reply.mtype, reply.assoc_handle), (MsgType::DENY, 2));
    assert_eq!(d.stat("malformed_truncated"), 2);
    assert_eq!(d.stat("malformed_too_long"), 1);
    assert_eq!(d.stat("malformed_version"), 1);
    assert_eq!(d.stat("malformed_ipv"), 1);
    assert_eq!(d.stat("malformed"), 5);
    assert_eq!(d.stat("stray_replies"), 2);
    assert_eq!(d.stat("stray_acks"), 1);
    assert_eq!(d.stat("rx"), 9);
    // Nothing else arrives.
    s.set_nonblocking(true).unwrap();
    let mut b = [0u8; 64];
    assert_eq!(
        s.recv(&mut b).unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock
    );
}

#[test]
fn duplicate_then_timer_expires() {
    let d = Daemon::start(&["--accept-timeout-ms", "200"]);
    let r = Registered::new(&d, "127.0.0.1");
    let s = raw_socket(&d);
    let req = pmreq(r.ap(), "127.0.0.1:4000".parse().unwrap(), 77);
    s.send(&req.to_bytes()).unwrap();
    let a1 = recv_msg(&s);
    s.send(&req.to_bytes()).unwrap();
    let a2 = recv_msg(&s);
    assert_eq!(a1, a2);
    assert_eq!(a1.mtype, MsgType::ACCEPT);
    assert_eq!(a1.ap_port, r.sdp().port());
    assert_eq!(d.stat("duplicates"), 1);
    assert_eq!(d.stat("pending"), 1);
    // A new AssocHandle on the same four-tuple replaces the state.
    let req2 = MessageRepr {
        assoc_handle: 78,
        ..req
    };
    s.send(&req2.to_bytes()).unwrap();
    assert_eq!(recv_msg(&s).assoc_handle, 78);
    assert_eq!(d.stat("replaced"), 1);
    assert_eq!(d.stat("pending"), 1);
    // No PMAck: the timer deletes the state.
    assert!(d.wait_for(Duration::from_secs(3), |d| d.stat("pending") == 0));
    assert_eq!(d.stat("expired"), 1);
}

#[test]
fn connection_notice_completes_transaction() {
    let d = Daemon::start(&["--accept-timeout-ms", "60000"]);
    let mut r = Registered::new(&d, "127.0.0.1");
    let s = raw_socket(&d);
    let cp: SocketAddr = "127.0.0.1:4001".parse().unwrap();
    s.send(&pmreq(r.ap(), cp, 5).to_bytes()).unwrap();
    assert_eq!(recv_msg(&s).mtype, MsgType::ACCEPT);
    assert_eq!(d.stat("pending"), 1);
    // Only the owner of Q may say so.
    let mut stranger = d.ctl();
    assert!(stranger.connected(r.sdp().port(), cp).is_err());
    r.ctl.connected(r.sdp().port(), cp).unwrap();
    assert_eq!(d.stat("pending"), 0);
    assert_eq!(d.stat("connected"), 1);
}

#[test]
fn sigterm_shuts_down_cleanly() {
    let mut d = Daemon::start(&[]);
    let _r = Registered::new(&d, "127.0.0.1");
    assert!(d.control.exists());
    signal(&d, "TERM");
    let status = wait_exit(&mut d.child, Duration::from_secs(10));
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert!(!d.control.exists());
    let log = d.log();
    assert!(log.contains("msg=signal action=shutdown"), "{log}");
    assert!(log.contains("msg=shutdown "), "{log}");
}

#[test]
fn sighup_applies_changed_config_and_keeps_state() {
    let conf = ConfigFile::new("pm-time = 10\naccept-timeout-ms = 60000\n");
    let d = Daemon::start(&["--config", conf.arg()]);
    let r = Registered::new(&d, "127.0.0.1");
    let s = raw_socket(&d);
    // 10 s is 40 quarter seconds (§7.3.1.4).
    assert_eq!(answer_pm_time(&s, &r, 1), 40);
    assert_eq!(d.stat("pending"), 1);

    conf.write("# shorter caching\npm-time = 5\naccept-timeout-ms = 60000\nrate = 100\n");
    signal(&d, "HUP");
    let log = wait_log(&d, "msg=reloaded", 1);
    assert!(
        log.contains(&format!(
            "msg=reloaded config={} changed=\"pm-time=5 rate=100\"",
            conf.arg()
        )),
        "{log}"
    );
    assert_eq!(answer_pm_time(&s, &r, 2), 20);
    // What was there before the reload is still there.
    let list = d.list();
    let reg = format!(
        "registration addr=127.0.0.1 port={} sdp_port={}",
        r.ap().port(),
        r.sdp().port()
    );
    assert!(list.iter().any(|l| l.starts_with(&reg)), "{list:?}");
    assert!(
        list.iter()
            .any(|l| l.starts_with("pending handle=0x0000000000000001 ")),
        "{list:?}"
    );
    assert_eq!(d.stat("pending"), 2);
    assert_eq!(d.stat("accepts"), 2);
}

#[test]
fn sighup_with_broken_config_keeps_settings() {
    let conf = ConfigFile::new("pm-time = 10\n");
    let d = Daemon::start(&["--config", conf.arg()]);
    let r = Registered::new(&d, "127.0.0.1");
    let s = raw_socket(&d);
    assert_eq!(answer_pm_time(&s, &r, 1), 40);

    conf.write("pm-time = 5\nthis is not a setting\n");
    signal(&d, "HUP");
    let log = wait_log(&d, "msg=reload_failed", 1);
    assert!(
        log.contains(&format!(
            "error=\"{}:2: expected `name = value`",
            conf.arg()
        )),
        "{log}"
    );
    assert!(!log.contains("msg=reloaded"), "{log}");
    assert_eq!(answer_pm_time(&s, &r, 2), 40, "the old pm-time stays");
    assert_eq!(d.stat("registrations"), 1);

    // Mended, the file is read again on the next SIGHUP.
    conf.write("pm-time = 5\n");
    signal(&d, "HUP");
    wait_log(&d, "msg=reloaded", 1);
    assert_eq!(answer_pm_time(&s, &r, 3), 20);
}

#[test]
fn sighup_without_config_has_nothing_to_reload() {
    let d = Daemon::start(&[]);
    let _r = Registered::new(&d, "127.0.0.1");
    signal(&d, "HUP");
    let log = wait_log(&d, "msg=reload_skipped", 1);
    assert!(log.contains("nothing to reload"), "{log}");
    assert_eq!(d.stat("registrations"), 1);
}

#[test]
fn sighup_keeps_settings_that_need_a_restart() {
    // No --bind on the command line, so the file's would count.
    let conf = ConfigFile::new("pm-time = 10\n");
    let d = Daemon::start_bound(&[], &["--config", conf.arg()]);
    let r = Registered::new(&d, "127.0.0.1");
    conf.write("pm-time = 10\nbind = 127.0.0.1\nmax-pending = 100\n");
    signal(&d, "HUP");
    let log = wait_log(&d, "msg=reloaded", 1);
    assert!(
        log.contains(
            "msg=reload_needs_restart setting=bind running=\"\" configured=127.0.0.1 \
             reason=\"needs a restart\""
        ),
        "{log}"
    );
    assert!(log.contains("changed=\"max-pending=100\""), "{log}");
    // Still on the wildcard address, same port.
    let s = UdpSocket::bind("[::1]:0").unwrap();
    s.connect(("::1", d.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let ap: SocketAddr = (ip("::1"), r.ap().port()).into();
    s.send(&pmreq(ap, "[::1]:4000".parse().unwrap(), 1).to_bytes())
        .unwrap();
    assert_eq!(recv_msg(&s).mtype, MsgType::DENY, "answered from [::]");
}

#[test]
fn command_line_wins_over_config_file() {
    let conf = ConfigFile::new("pm-time = 10\nmax-pending = 50\n");
    let d = Daemon::start(&["--config", conf.arg(), "--pm-time", "20"]);
    let r = Registered::new(&d, "127.0.0.1");
    let s = raw_socket(&d);
    assert_eq!(answer_pm_time(&s, &r, 1), 80);
    // And on reload: the file's pm-time still loses.
    conf.write("pm-time = 1\nmax-pending = 60\n");
    signal(&d, "HUP");
    let log = wait_log(&d, "msg=reloaded", 1);
    assert!(log.contains("changed=\"max-pending=60\""), "{log}");
    assert_eq!(answer_pm_time(&s, &r, 2), 80);
}

#[test]
fn bad_config_at_start_is_a_usage_error() {
    let conf = ConfigFile::new("# settings\nport = 0\n\nrate = fast\n");
    let out = run_limited(
        Command::new(common::BIN).args(["--config", conf.arg(), "--bind", "127.0.0.1"]),
        Duration::from_secs(10),
    );
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with(&format!(
            "sdp-portmapper: {}:4: rate: bad value \"fast\"",
            conf.arg()
        )),
        "{err}"
    );
    assert!(out.stdout.is_empty(), "no ready line");

    let out = run_limited(
        Command::new(common::BIN).args(["--config", "/nonexistent/pm.conf"]),
        Duration::from_secs(10),
    );
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read /nonexistent/pm.conf"));
}

#[test]
fn journal_stream_lines_carry_priority_not_time() {
    use std::os::unix::fs::MetadataExt;
    let dir = ConfigFile::new("");
    let log_path = dir.dir.join("journal.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let m = log.metadata().unwrap();
    let mut child = Command::new(common::BIN)
        .args(["--port", "0", "--bind", "127.0.0.1", "--control"])
        .arg(dir.dir.join("control.sock"))
        // Standard error is "the journal stream" this names.
        .env("JOURNAL_STREAM", format!("{}:{}", m.dev(), m.ino()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut ready = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut ready)
        .unwrap();
    assert!(ready.starts_with("ready "), "{ready}");
    let st = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(
        wait_exit(&mut child, Duration::from_secs(10)).code(),
        Some(0)
    );
    let text = std::fs::read_to_string(&log_path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with("<6>level=info msg=started udp=127.0.0.1:"),
        "{text}"
    );
    assert!(
        lines.iter().all(|l| l.starts_with("<6>level=info msg=")),
        "{text}"
    );
    assert!(!text.contains(" ts=") && !text.contains(">ts="), "{text}");
}

/// A settings file in a private directory, removed on drop.
struct ConfigFile {
    dir: PathBuf,
    path: String,
}

impl ConfigFile {
    fn new(text: &str) -> ConfigFile {
        let dir = common::temp_dir();
        let path = dir.join("sdp-portmapper.conf").display().to_string();
        let f = ConfigFile { dir, path };
        f.write(text);
        f
    }

    /// Replace the contents at once (write and rename), as an editor would,
    /// so the daemon never reads half a file.
    fn write(&self, text: &str) {
        let tmp = self.dir.join("new.conf");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &self.path).unwrap();
    }

    fn arg(&self) -> &str {
        &self.path
    }
}

impl Drop for ConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn signal(d: &Daemon, sig: &str) {
    let st = Command::new("kill")
        .args([&format!("-{sig}"), &d.pid().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
}

/// Poll the daemon's log until it holds `needle` at least `count` times.
/// Returns the log; panics with it after 10 s.
fn wait_log(d: &Daemon, needle: &str, count: usize) -> String {
    let held = d.wait_for(Duration::from_secs(10), |d| {
        d.log().matches(needle).count() >= count
    });
    let log = d.log();
    assert!(held, "no {needle:?} in the log:\n{log}");
    log
}

/// Wait for the process to exit; kill it and fail after `within`.
fn wait_exit(child: &mut Child, within: Duration) -> ExitStatus {
    let end = Instant::now() + within;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if Instant::now() > end {
            let _ = child.kill();
            panic!("still running after {within:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Run a command that should exit at once, within `within`.
fn run_limited(cmd: &mut Command, within: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_exit(&mut child, within);
    child.wait_with_output().unwrap()
}

/// The PmTime the daemon puts in its PMAccept for `r` now.
fn answer_pm_time(s: &UdpSocket, r: &Registered, handle: u64) -> u8 {
    let cp: SocketAddr = (ip("127.0.0.1"), 4000 + handle as u16).into();
    s.send(&pmreq(r.ap(), cp, handle).to_bytes()).unwrap();
    let a = recv_msg(s);
    assert_eq!((a.mtype, a.assoc_handle), (MsgType::ACCEPT, handle));
    a.pm_time.0
}

#[test]
fn second_daemon_on_same_control_path_refuses() {
    let d = Daemon::start(&[]);
    let out = run_limited(
        Command::new(common::BIN)
            .args(["--port", "0", "--bind", "127.0.0.1", "--control"])
            .arg(&d.control),
        Duration::from_secs(10),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("already serves"));
    // The first one still answers.
    assert_eq!(d.stat("registrations"), 0);
}

#[test]
fn query_and_list_commands() {
    let d = Daemon::start(&[]);
    let r = Registered::new(&d, "127.0.0.1");
    let out = Command::new(common::BIN)
        .args([
            "query",
            "--port",
            &d.port.to_string(),
            "127.0.0.1",
            &r.ap().port().to_string(),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.starts_with(&format!("accept sdp={} pm_time=120 cache=30000ms", r.sdp())),
        "{text}"
    );

    let out = Command::new(common::BIN)
        .args(["query", "--port", &d.port.to_string(), "127.0.0.1", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "deny\n");

    let out = Command::new(common::BIN)
        .args(["list", "--control"])
        .arg(&d.control)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        text.contains(&format!(
            "registration addr=127.0.0.1 port={} sdp_port={} pid={}",
            r.ap().port(),
            r.sdp().port(),
            std::process::id()
        )),
        "{text}"
    );
    assert!(text.contains("stats rx=3 accepts=1 denies=1"), "{text}");
}

#[test]
fn load_balancing_rewrites_ap_addr() {
    let d = Daemon::start(&["--rewrite-addr", "127.0.0.2", "--rewrite-addr", "127.0.0.3"]);
    let r = Registered::new(&d, "0.0.0.0");
    let s = raw_socket(&d);
    let ap: SocketAddr = (ip("127.0.0.1"), r.ap().port()).into();
    let mut got = Vec::new();
    for i in 0..3u16 {
        s.send(&pmreq(ap, (ip("127.0.0.1"), 5000 + i).into(), 9).to_bytes())
            .unwrap();
        let a = recv_msg(&s);
        assert_eq!(a.mtype, MsgType::ACCEPT);
        got.push(a.ap_addr);
        // Connectable: Q listens on the wildcard address.
        TcpStream::connect((a.ap_addr, a.ap_port)).unwrap();
    }
    assert_eq!(got, [ip("127.0.0.2"), ip("127.0.0.3"), ip("127.0.0.2")]);
}

/// A separate process that listens on P and Q and registers them; it lives
/// until killed. It is this test binary run again, see `helper_registrant`.
struct Helper {
    child: std::process::Child,
    p: u16,
    q: u16,
}

impl Helper {
    fn spawn(d: &Daemon, addr: &str) -> Helper {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "helper_registrant",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("PM_HELPER_CONTROL", &d.control)
            .env("PM_HELPER_ADDR", addr)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        for line in out.lines() {
            let line = line.unwrap();
            // libtest may print "test helper_registrant ... " first.
            if let Some((_, rest)) = line.split_once("REGISTERED ") {
                let mut w = rest.split_whitespace().map(|x| x.parse().unwrap());
                return Helper {
                    child,
                    p: w.next().unwrap(),
                    q: w.next().unwrap(),
                };
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("helper did not register");
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Not a test on its own: the body of `Helper` when run with its variables.
#[test]
fn helper_registrant() {
    let Some(control) = std::env::var_os("PM_HELPER_CONTROL") else {
        return;
    };
    let addr = std::env::var("PM_HELPER_ADDR").unwrap();
    let p = TcpListener::bind((addr.as_str(), 0)).unwrap();
    let q = TcpListener::bind((addr.as_str(), 0)).unwrap();
    let mut ctl = ControlClient::connect(control).unwrap();
    ctl.register(addr.parse().unwrap(), port(&p), port(&q))
        .unwrap();
    println!("REGISTERED {} {}", port(&p), port(&q));
    // Hold everything until killed (stdin never closes before that).
    let mut s = String::new();
    let _ = std::io::stdin().read_line(&mut s);
}
