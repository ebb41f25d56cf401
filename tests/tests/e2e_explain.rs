//! `sdp-stat --explain HOST:PORT`: the answer to "why is this connection
//! TCP?" for each kind of reason — a rule saying tcp, a PMDeny, no port
//! mapper at all, and a cached PMAccept held by a running program — and
//! the per-process count of sockets that went over TCP, by reason. Real
//! port mapper daemon, real preloaded Python programs, real `sdp-stat`.

use std::net::TcpListener;
use std::path::Path;
use std::process::Command;

use sdp_tests::e2e::{self, closed_udp_port, expect_sdp, expect_tcp, Env, Proc};
use sdp_tests::preload::{artifacts, Mode};

/// Connects to 127.0.0.1:PORT, says so, and holds the connection until a
/// line arrives on standard input.
const CLIENT: &str = r#"
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
print("connected", s.fileno(), flush=True)
sys.stdin.readline()
"#;

/// Listens on 127.0.0.1, prints the port, accepts one connection and holds
/// it until a line arrives on standard input.
const SERVER: &str = r#"
import socket, sys
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
print("listening", srv.getsockname()[1], flush=True)
c, _ = srv.accept()
sys.stdin.readline()
"#;

/// Starts `SERVER` under the preload; returns it and its port.
fn listen(env: &Env) -> (Proc, u16) {
    let mut server = Proc::spawn("server", env.python(SERVER, Mode::Sdp), true);
    let line = server.wait_line(|l| l.starts_with("listening "));
    let port = line["listening ".len()..].trim().parse().expect("port");
    (server, port)
}

/// `sdp-stat` with the test's export directory and port mapper port, and
/// the rules file `rules` (empty: no rule matches).
fn sdp_stat(env: &Env, pm_port: u16, rules: &str, args: &[&str]) -> String {
    let path = env.dir.path().join("rules.conf");
    std::fs::write(&path, rules).expect("write the rules file");
    let out = Command::new(&artifacts().sdp_stat)
        .arg("--dir")
        .arg(env.stat_dir())
        .args(args)
        .env("SDP_CONFIG", &path)
        .env("SDP_PM_PORT", pm_port.to_string())
        .env_remove("LIBSDP_CONFIG_FILE")
        .env_remove("SIMPLE_LIBSDP")
        .env_remove("ALWAYS_USE_SDP")
        .output()
        .expect("run sdp-stat");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "sdp-stat {args:?}: {:?}\n{text}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

fn contains_all(what: &str, text: &str, needles: &[&str]) {
    for n in needles {
        assert!(text.contains(n), "{what}: {n:?} not in\n{text}");
    }
}

fn rules_path(env: &Env) -> String {
    Path::new(env.dir.path())
        .join("rules.conf")
        .display()
        .to_string()
}

#[test]
fn explain_names_the_rule_the_deny_the_missing_port_mapper_and_the_cache() {
    let env = Env::new("explain");

    // An SDP server and a client that holds its connection: the client's
    // port mapper cache keeps the PMAccept.
    let (mut server, port) = listen(&env);
    let mut client = env.python(CLIENT, Mode::Sdp);
    client.arg(port.to_string());
    let mut client = Proc::spawn("client", client, true);
    client.wait_line(|l| l.starts_with("connected "));
    let (c, _) = env.connections(client.pid(), server.pid(), port, 1);
    expect_sdp("client", &c[0]);
    let target = format!("127.0.0.1:{port}");

    // A cached accept: the client holds it, the port mapper maps it.
    let text = sdp_stat(&env, env.pm.port, "", &["--explain", &target, "--json"]);
    contains_all(
        "cached accept",
        &text,
        &[
            "\"version\": 2",
            "\"rule\": null",
            "\"family\": \"both\"",
            &format!("\"pid\": {}", client.pid()),
            "\"answer\": \"accept\"",
            "\"port_mapper\": {\"answer\": \"accept\"",
            "\"verdict\": {\"transport\": \"sdp\"",
        ],
    );
    let human = sdp_stat(&env, env.pm.port, "", &["--explain", &target]);
    contains_all(
        "cached accept, text",
        &human,
        &[
            &format!("cached:      pid {} (", client.pid()),
            "PMAccept: SDP port",
            "so:          SDP:",
        ],
    );

    // A rule saying tcp: the port mapper is not asked.
    let rule = format!("use sdp client * 10.0.0.0/8:*\nuse tcp client * 127.0.0.1:{port}\n");
    let text = sdp_stat(&env, env.pm.port, &rule, &["--explain", &target, "--json"]);
    contains_all(
        "rule tcp",
        &text,
        &[
            &format!("\"source\": \"{} (from SDP_CONFIG)\"", rules_path(&env)),
            "\"rule\": 2",
            &format!("\"text\": \"use tcp client * 127.0.0.1/32:{port}\""),
            "\"family\": \"tcp\"",
            "\"port_mapper\": {\"answer\": \"not-asked\"",
            "\"verdict\": {\"transport\": \"tcp\", \"why\": \"rule-tcp (rule 2)\"}",
        ],
    );

    // A PMDeny: a plain TCP server, nothing registered for its port. A
    // preloaded client falls back to TCP and counts it.
    let plain = TcpListener::bind("127.0.0.1:0").expect("bind");
    let plain_port = plain.local_addr().expect("addr").port();
    let plain_target = format!("127.0.0.1:{plain_port}");
    let text = sdp_stat(
        &env,
        env.pm.port,
        "",
        &["--explain", &plain_target, "--json"],
    );
    contains_all(
        "pm deny",
        &text,
        &[
            "\"cached\": []",
            "\"port_mapper\": {\"answer\": \"deny\"}",
            "\"verdict\": {\"transport\": \"tcp\", \"why\": \"pm-deny",
        ],
    );
    let mut denied = env.python(CLIENT, Mode::Sdp);
    denied.arg(plain_port.to_string());
    let mut denied = Proc::spawn("denied client", denied, true);
    denied.wait_line(|l| l.starts_with("connected "));
    let pid = denied.pid().to_string();
    let text = sdp_stat(&env, env.pm.port, "", &["--json", "--pid", &pid]);
    contains_all(
        "fallback counted",
        &text,
        &[
            "\"tcp_by_reason\": {\"pm-deny\": 1}",
            &format!("\"key\": \"{plain_target}\", \"host\": false, \"answer\": 2"),
        ],
    );
    let table = sdp_stat(&env, env.pm.port, "", &["--pid", &pid]);
    contains_all("fallback table", &table, &["TCP BY REASON", "pm-deny=1"]);
    // The denial is cached in that process now.
    let text = sdp_stat(
        &env,
        env.pm.port,
        "",
        &["--explain", &plain_target, "--json"],
    );
    contains_all(
        "cached deny",
        &text,
        &[
            &format!("\"pid\": {}", denied.pid()),
            "\"answer\": \"deny\"",
        ],
    );

    // No port mapper: ICMP port unreachable.
    let text = sdp_stat(
        &env,
        closed_udp_port(),
        "",
        &["--explain", &target, "--json"],
    );
    contains_all(
        "no port mapper",
        &text,
        &[
            "\"port_mapper\": {\"answer\": \"unreachable\"}",
            "\"verdict\": {\"transport\": \"tcp\", \"why\": \"pm-unreachable",
        ],
    );
    // With a rule that allows no fallback, the connect would fail.
    let sdp_only = format!("use sdp client * 127.0.0.1:{port}\n");
    let text = sdp_stat(
        &env,
        closed_udp_port(),
        &sdp_only,
        &["--explain", &target, "--json"],
    );
    contains_all(
        "sdp only, no port mapper",
        &text,
        &["\"verdict\": {\"transport\": \"fails\""],
    );

    for p in [&mut client, &mut denied, &mut server] {
        p.send("\n");
    }
    client.finish_ok();
    denied.finish_ok();
    server.finish_ok();
}

#[test]
fn watch_prints_the_table_again_each_interval() {
    let env = Env::new("watch");
    let text = sdp_stat(&env, env.pm.port, "", &["--watch", "0.2", "--count", "3"]);
    assert_eq!(text.matches("\x1b[H\x1b[2J").count(), 3, "{text}");
    assert_eq!(text.matches("every 0.2 s;").count(), 3, "{text}");
    assert_eq!(text.matches("PROGRAM").count(), 3, "{text}");
    let json = sdp_stat(
        &env,
        env.pm.port,
        "",
        &["--watch", "0.2", "--count", "2", "--json"],
    );
    assert_eq!(
        json.matches("{\"version\": 2, \"processes\": []}").count(),
        2,
        "{json}"
    );
}

/// The OFED libsdp's `SIMPLE_LIBSDP`: SDP for every socket, whatever the
/// rules file says; without it the same file's `tcp` rule decides.
#[test]
fn simple_libsdp_means_sdp_for_every_socket_and_no_rules_file() {
    let env = Env::new("simple");
    let (mut server, port) = listen(&env);
    let tcp_rules = env.dir.path().join("tcp.conf");
    std::fs::write(&tcp_rules, "use tcp client * *:*\n").expect("write the rules");

    let run = |tag: &str, simple: bool| {
        let mut cmd = env.python(CLIENT, Mode::Sdp);
        cmd.arg(port.to_string()).env("SDP_CONFIG", &tcp_rules);
        if simple {
            cmd.env("SIMPLE_LIBSDP", "");
        }
        let mut client = Proc::spawn(tag, cmd, true);
        client.wait_line(|l| l.starts_with("connected "));
        let r = env.wait_records(tag, client.pid(), 1, |r| {
            r.role == e2e::field::CLIENT && r.peer.is_some_and(|a| a.port() == port)
        });
        client.send("\n");
        client.finish_ok();
        r[0].clone()
    };
    let simple = run("client with SIMPLE_LIBSDP", true);
    expect_sdp("SIMPLE_LIBSDP", &simple);
    // want sdp (1), decided by the first of the two rules it stands for.
    assert_eq!(
        (simple.want, simple.decided_by, simple.rule),
        (1, 2, 2),
        "{simple:?}"
    );
    let ruled = run("client by the rules file", false);
    expect_tcp("rule", &ruled, e2e::field::REASON_RULE_TCP);
    server.send("\n");
    server.finish_ok();
}
