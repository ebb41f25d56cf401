//! Zcopy with both directions busy at once (the soak's duplex
//! connections), between two real Python processes under the preload
//! (`SDP_ZCOPY=write` and `both`): each end has a writer thread lending
//! large buffers and a reader thread posting large receives (some with
//! `MSG_WAITALL`), with `SIGALRM` landing in the calls every 3 ms. Every
//! stream arrives whole (SHA-256 compared) and no call waits out its
//! `SO_RCVTIMEO`/`SO_SNDTIMEO`.
//!
//! The thread that is not the Zcopy owner may queue a message only the
//! owner writes to the socket (the SendSm answering the peer's SrcAvail,
//! a credit update), or complete the owner's buffer (the peer's
//! RdmaRdCompl): it must wake the owner, or both ends wait on each other
//! until the timeout.

use sdp_tests::e2e::{Env, Proc};
use sdp_tests::preload::Mode;

/// Both programs: `server` prints its port, then serves; `client PORT`
/// runs the connections, four at a time, and prints `ok N`.
const DUPLEX: &str = r#"
import hashlib, os, signal, socket, struct, sys, threading
CONNS, SIZE = 24, 6 << 20
SENDS = [1024, 60000, 300000, 1 << 20, 4 << 20]
RECVS = [1000, 100000, 1 << 20, 4 << 20]

def stream(seed):
    block = hashlib.sha256(seed.to_bytes(8, "little")).digest() * 2048
    return (block * (SIZE // len(block) + 1))[:SIZE]

def duplex(s, out_seed, in_seed):
    tv = struct.pack("ll", 20, 0)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
    out = memoryview(stream(out_seed))
    def send():
        off, k = 0, out_seed
        while off < SIZE:
            n = min(SENDS[k % len(SENDS)], SIZE - off)
            s.sendall(out[off:off + n])
            off, k = off + n, k + 1
    t = threading.Thread(target=send)
    t.start()
    h, got, k, buf = hashlib.sha256(), 0, in_seed, bytearray(4 << 20)
    while got < SIZE:
        flags = socket.MSG_WAITALL if k % 3 == 0 else 0
        n = s.recv_into(buf, min(RECVS[k % len(RECVS)], SIZE - got), flags)
        if n == 0:
            raise RuntimeError(f"end of stream after {got} of {SIZE}")
        h.update(buf[:n])
        got, k = got + n, k + 1
    t.join()
    if h.digest() != hashlib.sha256(stream(in_seed)).digest():
        raise RuntimeError("the stream differs")

signal.signal(signal.SIGALRM, lambda *a: None)
signal.setitimer(signal.ITIMER_REAL, 0.003, 0.003)
if sys.argv[1] == "server":
    l = socket.socket()
    l.bind(("127.0.0.1", 0))
    l.listen(16)
    print(l.getsockname()[1], flush=True)
    def serve(c):
        seed = int.from_bytes(c.recv(8, socket.MSG_WAITALL), "little")
        duplex(c, seed + 1, seed)
        c.close()
    while True:
        c, _ = l.accept()
        threading.Thread(target=serve, args=(c,), daemon=True).start()
else:
    port, ok, errors = int(sys.argv[2]), [0], []
    def one(i):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall((2 * i).to_bytes(8, "little"))
        try:
            duplex(s, 2 * i, 2 * i + 1)
            ok[0] += 1
        except Exception as e:
            errors.append(f"connection {i}: {e!r}")
        s.close()
    threads = []
    for i in range(CONNS):
        threads.append(threading.Thread(target=one, args=(i,)))
        threads[-1].start()
        if len(threads) == 4:
            threads.pop(0).join()
    for t in threads:
        t.join()
    signal.setitimer(signal.ITIMER_REAL, 0, 0)
    for e in errors:
        print(e, flush=True)
    print(f"ok {ok[0]}", flush=True)
"#;

fn both_ways_at_once(mode: &str) {
    let env = Env::new(&format!("zcopy-duplex-{mode}"));
    let py = |args: &[&str]| {
        let mut cmd = env.python(DUPLEX, Mode::Sdp);
        cmd.args(args).env("SDP_ZCOPY", mode);
        cmd
    };
    let mut server = Proc::spawn("duplex server", py(&["server"]), false);
    let port = server.line();
    let client = Proc::spawn("duplex client", py(&["client", port.trim()]), false).finish_ok();
    assert_eq!(
        client.stdout.trim(),
        "ok 24",
        "client:\n{}\nserver:\n{}",
        client.stderr,
        server.transcript()
    );
    server.signal(libc::SIGTERM);
}

#[test]
fn write_zcopy_both_ways_at_once_never_stalls() {
    both_ways_at_once("write");
}

#[test]
fn read_and_write_zcopy_both_ways_at_once_never_stall() {
    both_ways_at_once("both");
}
