//! `sdp-stat` shows the connections of a running preloaded program: the
//! echo server and client of the suite, one line per socket.

use sdp_tests::e2e::{expect, Env, Expect, Proc, ECHO_CLIENT, ECHO_SERVER};
use sdp_tests::preload::Mode;
use std::process::Command;

#[test]
fn sdp_stat_lists_the_connections_of_running_programs() {
    let env = Env::new("sdp-stat");
    let mut server = Proc::spawn("echo server", env.python(ECHO_SERVER, Mode::Preload), false);
    let line = server.wait_line(|l| l.starts_with("listening "));
    let port = line.split_whitespace().nth(1).unwrap().to_owned();
    let mut cmd = env.python(ECHO_CLIENT, Mode::Preload);
    cmd.args(["127.0.0.1", &port, "7", "1000"]);
    let mut client = Proc::spawn("echo client", cmd, true);
    let line = client.wait_line(|l| l.starts_with("echo "));
    let w: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(w[1], "True");
    let (pid, fd) = (w[2], w[3]);
    env.wait_records("the client", pid.parse().unwrap(), 1, |r| {
        r.fd.to_string() == fd
    });

    let out = Command::new(env!("CARGO_BIN_EXE_sdp-stat"))
        .arg("--dir")
        .arg(env.stat_dir())
        .arg(pid)
        .output()
        .expect("run sdp-stat");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row: Vec<&str> = text
        .lines()
        .find(|l| l.split_whitespace().nth(2) == Some(fd))
        .unwrap_or_else(|| panic!("no line for fd {fd}:\n{text}"))
        .split_whitespace()
        .collect();
    assert_eq!(row[0], pid);
    assert!(row[1].starts_with("python3"), "{text}");
    assert_eq!(row[3], "client");
    let transport = match expect() {
        Expect::Sdp => "SDP",
        Expect::Tcp => "TCP(no-sdp-engine)",
    };
    assert_eq!(row[4], transport, "{text}");
    assert_eq!(row[6], format!("127.0.0.1:{port}"));

    // A pid without a file is an error.
    let out = Command::new(env!("CARGO_BIN_EXE_sdp-stat"))
        .arg("--dir")
        .arg(env.stat_dir())
        .arg(server.pid().to_string() + "0")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    client.send("\n");
    client.finish_ok();
}
