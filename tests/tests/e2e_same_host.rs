//! Issue 18: the same-host path between two unmodified programs under the
//! preload. A Python server and client, each sending a seeded stream of
//! 64 MiB to the other at once and hashing what it receives, over one SDP
//! connection: the hashes match the streams, and the state export shows
//! the bytes each end wrote into the other's memory — or, with
//! `SDP_LOCAL=off` on one end, shows both directions on the wire and why.
//! A server that forks after its ring was offered hands the connection to
//! its child with every byte.

use sdp_tests::e2e::{expect_sdp, Env, Proc};
use sdp_tests::preload::Mode;
use sdp_tests::statfile::Record;

const BYTES: u64 = 64 << 20;

/// Sends `BYTES` of the stream of `seed` while it reads the peer's, then
/// prints both SHA-256 and waits for a line on standard input before it
/// closes (so the test can read its state export first).
const PEER: &str = r#"
import hashlib, os, random, socket, sys, threading
role, seed, total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if role == "listen":
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    print("listening", srv.getsockname()[1], flush=True)
    s, _ = srv.accept()
else:
    s = socket.socket()
    s.connect(("127.0.0.1", int(sys.argv[4])))
print("connected", os.getpid(), s.fileno(), flush=True)
block = random.Random(seed).randbytes(1 << 20)
sent = hashlib.sha256()
def send():
    left = total
    while left:
        n = min(left, len(block))
        s.sendall(block[:n])
        sent.update(block[:n])
        left -= n
writer = threading.Thread(target=send)
writer.start()
got, n = hashlib.sha256(), 0
while n < total:
    d = s.recv(1 << 20)
    if not d:
        break
    got.update(d)
    n += len(d)
writer.join()
print("done", n, sent.hexdigest(), got.hexdigest(), flush=True)
sys.stdin.readline()
s.close()
"#;

/// Where the two ends stand after the transfer.
struct Ends {
    server: Record,
    client: Record,
}

fn exchange(tag: &str, client_env: &[(&str, &str)]) -> Ends {
    let env = Env::new(tag);
    let mut server = env.python(PEER, Mode::Sdp);
    server.args(["listen", "1", &BYTES.to_string()]);
    let mut server = Proc::spawn("server", server, true);
    let line = server.wait_line(|l| l.starts_with("listening "));
    let port: u16 = line["listening ".len()..].trim().parse().expect("port");
    let mut client = env.python(PEER, Mode::Sdp);
    client.args(["connect", "2", &BYTES.to_string(), &port.to_string()]);
    client.envs(client_env.iter().copied());
    let mut client = Proc::spawn("client", client, true);
    let (c, s) = env.connections(client.pid(), server.pid(), port, 1);
    expect_sdp(&format!("{tag}: client"), &c[0]);
    expect_sdp(&format!("{tag}: server"), &s[0]);

    let done = |p: &mut Proc| -> Vec<String> {
        let l = p.wait_line(|l| l.starts_with("done "));
        l.split_whitespace().map(str::to_string).collect()
    };
    let (sd, cd) = (done(&mut server), done(&mut client));
    assert_eq!(sd[1], BYTES.to_string(), "{tag}: the server received all");
    assert_eq!(cd[1], BYTES.to_string(), "{tag}: the client received all");
    assert_eq!(sd[3], cd[2], "{tag}: the server got what the client sent");
    assert_eq!(cd[3], sd[2], "{tag}: the client got what the server sent");

    // The figures are published every SDP_STAT_INTERVAL_MS: wait for the
    // last bytes to show.
    let settled = |pid: u32| {
        env.wait_for(&format!("{tag}: settled figures of {pid}"), |files| {
            let r = files
                .iter()
                .filter(|f| f.pid == pid)
                .flat_map(|f| &f.records)
                .find(|r| r.transport == 2 && r.role != 2)?;
            (r.counters[0] >= BYTES && r.counters[1] >= BYTES).then(|| r.clone())
        })
    };
    let ends = Ends {
        server: settled(server.pid()),
        client: settled(client.pid()),
    };
    server.send("\n");
    client.send("\n");
    server.finish_ok();
    client.finish_ok();
    ends
}

#[test]
fn two_programs_on_one_host_write_into_each_others_memory() {
    let e = exchange("same-host", &[]);
    for (name, r, peer) in [
        ("server", &e.server, &e.client),
        ("client", &e.client, &e.server),
    ] {
        // Writing into the peer's ring (1), its own ring offered (bit 16).
        assert_eq!(r.same_host, 0x1_0001, "{name}: {r:?}");
        // All but the first 256 KiB and the odd short message.
        assert!(r.same_host_bytes[0] > BYTES / 2, "{name}: {r:?}");
        assert_eq!(r.same_host_bytes[0], peer.same_host_bytes[1], "{name}");
    }
}

#[test]
fn sdp_local_off_keeps_both_directions_on_the_wire() {
    let e = exchange("same-host-off", &[("SDP_LOCAL", "off")]);
    // The client speaks no extension: nothing offered either way, and it
    // says why; the server saw no offer.
    assert_eq!(e.client.same_host, 2, "{:?}", e.client);
    assert_eq!(e.server.same_host, 0, "{:?}", e.server);
    for r in [&e.client, &e.server] {
        assert_eq!(r.same_host_bytes, [0, 0], "{r:?}");
    }
}

/// Takes 4 MiB (its ring is offered after 256 KiB), forks, and the child
/// reads the rest; the parent closes its copy and waits for the child.
const FORKING_SERVER: &str = r#"
import hashlib, os, socket, sys
total = int(sys.argv[1])
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
print("listening", srv.getsockname()[1], flush=True)
s, _ = srv.accept()
got, n = hashlib.sha256(), 0
def take(upto):
    global n
    while n < upto:
        d = s.recv(min(1 << 20, upto - n))
        if not d:
            break
        got.update(d)
        n += len(d)
take(4 << 20)
pid = os.fork()
if pid == 0:
    take(total)
    print("done", n, got.hexdigest(), flush=True)
    s.close()
    os._exit(0)
s.close()
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"#;

/// Sends `total` bytes of a seeded stream, prints their SHA-256, waits for
/// a line, closes.
const SENDER: &str = r#"
import hashlib, os, random, socket, sys
total, port = int(sys.argv[1]), int(sys.argv[2])
s = socket.socket()
s.connect(("127.0.0.1", port))
print("connected", os.getpid(), s.fileno(), flush=True)
block = random.Random(3).randbytes(1 << 20)
sent, left = hashlib.sha256(), total
while left:
    k = min(left, len(block))
    s.sendall(block[:k])
    sent.update(block[:k])
    left -= k
print("sent", sent.hexdigest(), flush=True)
sys.stdin.readline()
s.close()
"#;

#[test]
fn a_server_that_forks_after_its_offer_loses_nothing() {
    let env = Env::new("same-host-fork");
    let mut server = env.python(FORKING_SERVER, Mode::Sdp);
    server.arg(BYTES.to_string());
    let mut server = Proc::spawn("server", server, false);
    let line = server.wait_line(|l| l.starts_with("listening "));
    let port: u16 = line["listening ".len()..].trim().parse().expect("port");
    let mut client = env.python(SENDER, Mode::Sdp);
    client.args([BYTES.to_string(), port.to_string()]);
    let mut client = Proc::spawn("client", client, true);
    let sent = client.wait_line(|l| l.starts_with("sent "));
    let done = server.wait_line(|l| l.starts_with("done "));
    let done: Vec<&str> = done.split_whitespace().collect();
    assert_eq!(done[1], BYTES.to_string(), "the child received all");
    assert_eq!(
        done[2],
        sent["sent ".len()..].trim(),
        "the child got the stream"
    );
    // The client's writes into the parent's ring stopped at the fork: its
    // next read of the token found it revoked (3: "other-host").
    let r = env.wait_for("the client's figures", |files| {
        files
            .iter()
            .filter(|f| f.pid == client.pid())
            .flat_map(|f| &f.records)
            .find(|r| r.transport == 2 && r.role == 1 && r.counters[0] >= BYTES)
            .cloned()
    });
    assert_eq!(r.same_host & 0xffff, 3, "{r:?}");
    client.send("\n");
    client.finish_ok();
    server.finish_ok();
}
