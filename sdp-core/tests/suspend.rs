//! Socket duplication over loopback (draft §13.1.1): a peer built from the
//! library's own pieces plays the Controlling side — it sends a SuspComm
//! naming the port of a new listener, gets the SuspCommAck, accepts the
//! new connection (Hello, HelloAck) and goes on with the byte streams —
//! while an application on an [`SdpStream`] moves 16 MiB each way with
//! blocking reader and writer threads and notices nothing.

use std::io::{Read, Write};
use std::net::Shutdown;
use std::sync::mpsc;
use std::time::Duration;

use sdp_core::stream::{SdpListener, SdpStream};
use sdp_core::testing::{pattern, StreamHash};

const TOTAL: u64 = 16 << 20;
const CHUNK: usize = 64 * 1024;

/// Writes bytes `from..to` of the test stream `seed`; returns their hash.
fn write_range(mut s: &SdpStream, seed: u64, from: u64, to: u64, hash: &mut StreamHash) {
    let mut buf = vec![0; CHUNK];
    let mut at = from;
    while at < to {
        let n = ((to - at) as usize).min(CHUNK);
        pattern(seed, at, &mut buf[..n]);
        s.write_all(&buf[..n]).unwrap();
        hash.update(&buf[..n]);
        at += n as u64;
    }
}

/// Reads until the end of the stream, checking every byte against the test
/// stream `seed` from offset `from`; returns the offset reached.
fn read_to_end(mut s: &SdpStream, seed: u64, from: u64, hash: &mut StreamHash) -> u64 {
    let mut buf = vec![0; CHUNK];
    let mut want = vec![0; CHUNK];
    let mut at = from;
    loop {
        let n = s.read(&mut buf).unwrap();
        if n == 0 {
            return at;
        }
        pattern(seed, at, &mut want[..n]);
        assert!(buf[..n] == want[..n], "wrong bytes at offset {at}");
        hash.update(&buf[..n]);
        at += n as u64;
    }
}

#[test]
fn suspcomm_moves_a_busy_connection_without_the_application_noticing() {
    const CLIENT_SEED: u64 = 0xc1;
    const SERVER_SEED: u64 = 0x5e;
    // What the Controlling side writes on the first connection.
    const FIRST: u64 = 6 << 20;
    // What the application writes before it waits for the SuspComm to be
    // asked for: with the threads starved unevenly (a loaded machine), it
    // could otherwise finish before the Controlling side wrote FIRST,
    // leaving no transfer to move. Usually the wait is over by then.
    const UNTIL_ASKED: u64 = 12 << 20;

    let listener = SdpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    // §13.1.1 step 1: the non-Controlling Address Space accepts on a new
    // port.
    let next = SdpListener::bind("127.0.0.1:0").unwrap();
    let next_port = next.local_addr().unwrap().port();
    let (asked_tx, asked) = mpsc::channel();

    let server = std::thread::spawn(move || {
        let (first, _) = listener.accept().unwrap();
        let (to_writer, writer_gets) = mpsc::channel::<SdpStream>();
        let (to_reader, reader_gets) = mpsc::channel::<SdpStream>();
        let (flushed_tx, flushed) = mpsc::channel();
        let w_first = first.clone();
        let writer = std::thread::spawn(move || {
            let mut hash = StreamHash::default();
            write_range(&w_first, SERVER_SEED, 0, FIRST, &mut hash);
            // §13.1.1 step 2: nothing In-Process before the SuspComm.
            (&w_first).flush().unwrap();
            flushed_tx.send(()).unwrap();
            let second = writer_gets.recv().unwrap();
            write_range(&second, SERVER_SEED, FIRST, TOTAL, &mut hash);
            second.shutdown(Shutdown::Write).unwrap();
            hash
        });
        let r_first = first.clone();
        let reader = std::thread::spawn(move || {
            let mut hash = StreamHash::default();
            // The old connection's bytes, up to its end after the
            // SuspCommAck; then the new connection's.
            let at = read_to_end(&r_first, CLIENT_SEED, 0, &mut hash);
            assert!(r_first.susp_comm_acked());
            let second = reader_gets.recv().unwrap();
            let end = read_to_end(&second, CLIENT_SEED, at, &mut hash);
            (at, end, hash)
        });
        flushed.recv().unwrap();
        first.request_suspend(next_port);
        asked_tx.send(()).unwrap();
        let (second, _) = next.accept().unwrap();
        to_writer.send(second.clone()).unwrap();
        to_reader.send(second.clone()).unwrap();
        let written = writer.join().unwrap();
        let (at_switch, read, read_hash) = reader.join().unwrap();
        drop(first);
        second.set_linger(Some(Duration::from_secs(5))).unwrap();
        drop(second);
        (written, at_switch, read, read_hash)
    });

    let client = SdpStream::connect(addr).unwrap();
    let sock = client.socket_fd();
    let peer = client.peer_addr().unwrap();
    let w = client.clone();
    let writer = std::thread::spawn(move || {
        let mut hash = StreamHash::default();
        write_range(&w, CLIENT_SEED, 0, UNTIL_ASKED, &mut hash);
        asked.recv().unwrap();
        write_range(&w, CLIENT_SEED, UNTIL_ASKED, TOTAL, &mut hash);
        w.shutdown(Shutdown::Write).unwrap();
        hash
    });
    let r = client.clone();
    let reader = std::thread::spawn(move || {
        let mut hash = StreamHash::default();
        let end = read_to_end(&r, SERVER_SEED, 0, &mut hash);
        (end, hash)
    });
    let client_written = writer.join().unwrap();
    let (client_read, client_read_hash) = reader.join().unwrap();
    let (server_written, at_switch, server_read, server_read_hash) = server.join().unwrap();

    assert_eq!(client_read, TOTAL);
    assert_eq!(server_read, TOTAL);
    assert_eq!(client_read_hash, server_written);
    assert_eq!(server_read_hash, client_written);
    // The switch came mid-transfer: the Controlling side wrote FIRST
    // bytes before it, and the application held its last bytes until it
    // was asked for. (A reader starved until then reads none of them on
    // the first connection: the bytes received there and not read carry
    // over to the new one, §13.1.1 step 4.)
    assert!(at_switch < TOTAL, "{at_switch}");
    // The application's view did not change.
    assert_eq!(client.socket_fd(), sock);
    assert_eq!(client.peer_addr().unwrap(), peer);
    assert_eq!(client.take_error().unwrap().map(|e| e.to_string()), None);
}
