//! SdpStream and SdpListener over loopback: many connections at once,
//! nonblocking use with exact readiness, timeouts, and the errno a TCP
//! program expects.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use iwarp::engine::{Connection, ConnectionConfig, Event};
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use sdp_core::stream::readiness::LevelWatch;
use sdp_core::stream::{SdpListener, SdpStream};

fn pair() -> (SdpStream, SdpStream) {
    pair_with(&sdp_core::conn::Config::default())
}

fn pair_with(config: &sdp_core::conn::Config) -> (SdpStream, SdpStream) {
    let listener = SdpListener::bind_with("127.0.0.1:0", config).unwrap();
    let addr = listener.local_addr().unwrap();
    let t = std::thread::spawn(move || listener.accept().unwrap().0);
    let c = SdpStream::connect_with(addr, config).unwrap();
    (c, t.join().unwrap())
}

/// Blocking writes above 256 KiB lend their buffer.
fn lending_pair() -> (SdpStream, SdpStream) {
    pair_with(&sdp_core::conn::Config {
        lend_above: 256 * 1024,
        ..Default::default()
    })
}

/// `len` bytes of a multiplicative hash of their offset (bits from
/// `shift` on), so that a misplaced run shows.
fn scrambled(len: u32, shift: u32) -> Vec<u8> {
    (0..len)
        .map(|k| (k.wrapping_mul(2_654_435_761) >> shift) as u8)
        .collect()
}

/// (readable, writable) of the stream's descriptor, waiting at most `ms`
/// for any of `want`.
fn readiness(s: &SdpStream, want: PollFlags, ms: u64) -> (bool, bool) {
    let ts = Timespec {
        tv_sec: (ms / 1000) as i64,
        tv_nsec: ((ms % 1000) * 1_000_000) as i64,
    };
    let mut fds = [PollFd::new(s, want)];
    poll(&mut fds, Some(&ts)).unwrap();
    let ev = fds[0].revents();
    (ev.contains(PollFlags::IN), ev.contains(PollFlags::OUT))
}

/// Writes `buf` over and over on nonblocking `s` until a write would
/// block; returns the bytes taken.
fn fill_until_blocked(s: &SdpStream, buf: &[u8]) -> u64 {
    let mut sent = 0u64;
    loop {
        match (&*s).write(buf) {
            Ok(n) => sent += n as u64,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return sent,
            Err(e) => panic!("{e}"),
        }
    }
}

/// Reads `n` bytes from blocking `s`, whatever they are.
fn read_count(s: &SdpStream, n: u64) {
    let mut buf = vec![0; 1 << 16];
    let mut got = 0u64;
    while got < n {
        got += (&*s).read(&mut buf).unwrap() as u64;
    }
}

#[test]
fn echo_100_concurrent_connections() {
    let listener = SdpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let mut workers = Vec::new();
        for _ in 0..100 {
            let (s, _) = listener.accept().unwrap();
            workers.push(std::thread::spawn(move || {
                let mut buf = vec![0; 16 * 1024];
                let mut s = s;
                loop {
                    match s.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => s.write_all(&buf[..n]).unwrap(),
                        Err(e) => panic!("server read: {e}"),
                    }
                }
                s.shutdown(Shutdown::Write).unwrap();
            }));
        }
        for w in workers {
            w.join().unwrap();
        }
    });
    let clients: Vec<_> = (0..100u64)
        .map(|i| {
            std::thread::spawn(move || {
                let s = SdpStream::connect(addr).unwrap();
                let len = 100_000 + i as usize * 997;
                let data: Vec<u8> = (0..len).map(|k| (k as u64 * 31 + i) as u8).collect();
                let writer = {
                    let s = s.clone();
                    let data = data.clone();
                    std::thread::spawn(move || {
                        (&s).write_all(&data).unwrap();
                        s.shutdown(Shutdown::Write).unwrap();
                    })
                };
                let mut back = Vec::new();
                (&s).read_to_end(&mut back).unwrap();
                writer.join().unwrap();
                assert!(back == data, "connection {i}: echo differs");
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    server.join().unwrap();
}

#[test]
fn nonblocking_readiness_is_exact() {
    let (a, b) = pair();
    a.set_nonblocking(true).unwrap();
    let mut buf = vec![0; 1 << 20];
    // Connected, nothing received: writable only.
    assert_eq!(
        readiness(&a, PollFlags::IN | PollFlags::OUT, 0),
        (false, true)
    );
    assert_eq!(
        (&a).read(&mut buf).unwrap_err().kind(),
        io::ErrorKind::WouldBlock
    );
    // The peer writes: readable, and a read takes exactly that.
    (&b).write_all(b"ping").unwrap();
    assert_eq!(readiness(&a, PollFlags::IN, 2000), (true, false));
    assert_eq!((&a).read(&mut buf).unwrap(), 4);
    assert_eq!(readiness(&a, PollFlags::IN, 0), (false, false));
    // Fill our send path until a write would block: not writable.
    let sent = fill_until_blocked(&a, &buf);
    assert!(sent > 0);
    assert_eq!(
        readiness(&a, PollFlags::IN | PollFlags::OUT, 0),
        (false, false)
    );
    // The peer reads everything: credit updates come back (protocol-only
    // traffic: never readable), and we turn writable again.
    read_count(&b, sent);
    let t = Instant::now();
    while readiness(&a, PollFlags::OUT, 2000) != (false, true) {
        assert!(t.elapsed() < Duration::from_secs(5), "never writable again");
    }
    assert_eq!(readiness(&a, PollFlags::IN, 100), (false, false));
    // End of stream is readable.
    b.shutdown(Shutdown::Write).unwrap();
    assert!(readiness(&a, PollFlags::IN, 2000).0);
    assert_eq!((&a).read(&mut buf).unwrap(), 0);
}

/// What a [`LevelWatch`] was told, in order.
#[derive(Default)]
struct Told {
    levels: std::sync::Mutex<Vec<(bool, bool)>>,
    changed: std::sync::Condvar,
}

impl LevelWatch for Told {
    fn levels(&self, readable: bool, writable: bool) {
        self.levels.lock().unwrap().push((readable, writable));
        self.changed.notify_all();
    }
}

impl Told {
    /// Waits (at most 5 s) until the last levels told are `want`.
    fn until(&self, want: (bool, bool)) {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut told = self.levels.lock().unwrap();
        while told.last() != Some(&want) {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "never told {want:?}; told {:?}", *told);
            told = self.changed.wait_timeout(told, left).unwrap().0;
        }
    }
}

#[test]
fn a_level_watch_is_told_each_change_and_nothing_once_it_stops() {
    let (a, b) = pair();
    a.set_nonblocking(true).unwrap();
    let told = std::sync::Arc::new(Told::default());
    let watch: std::sync::Arc<dyn LevelWatch> = told.clone();
    a.watch_levels(watch.clone());
    // The levels of now first: connected, nothing received.
    assert_eq!(*told.levels.lock().unwrap(), [(false, true)]);
    // The peer writes: readable (the progress thread tells it).
    (&b).write_all(b"ping").unwrap();
    told.until((true, true));
    let mut buf = vec![0; 1 << 20];
    assert_eq!((&a).read(&mut buf).unwrap(), 4);
    told.until((false, true));
    // Out of credits: neither readable nor writable.
    let sent = fill_until_blocked(&a, &buf);
    told.until((false, false));
    read_count(&b, sent);
    told.until((false, true));
    // Stopped: the next arrival is read, and the watch heard nothing of it.
    a.unwatch_levels(&watch);
    let before = told.levels.lock().unwrap().len();
    (&b).write_all(b"pong").unwrap();
    a.set_nonblocking(false).unwrap();
    assert_eq!((&a).read(&mut buf).unwrap(), 4);
    assert_eq!(told.levels.lock().unwrap().len(), before);
}

#[test]
fn read_timeout_gives_eagain_and_connect_timeout_etimedout() {
    let (a, _b) = pair();
    a.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let t = Instant::now();
    let e = (&a).read(&mut [0; 8]).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
    assert!(t.elapsed() >= Duration::from_millis(100));
    assert!(t.elapsed() < Duration::from_secs(2));
    // A TCP server that never answers the MPA Request.
    let mute = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = mute.local_addr().unwrap();
    let t = Instant::now();
    let e = SdpStream::connect_timeout(&addr, Duration::from_millis(300)).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(110), "{e}"); // ETIMEDOUT
    assert!(t.elapsed() < Duration::from_secs(3));
    drop(mute);
}

#[test]
fn connection_refused_by_tcp_and_by_mpa_reject() {
    // Nobody listens.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    let e = SdpStream::connect(addr).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(111), "{e}");
    // An iWARP responder that rejects the MPA Request.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr: SocketAddr = l.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut tcp, _) = l.accept().unwrap();
        let now = Instant::now();
        let mut qp = Connection::listen(ConnectionConfig::default(), now);
        let mut buf = [0u8; 1024];
        loop {
            let n = tcp.read(&mut buf).unwrap();
            qp.handle_input(now, &buf[..n], &mut iwarp::mem::VecMemory::new());
            if let Some(Event::ConnectRequest { .. }) = qp.poll_event() {
                break;
            }
        }
        qp.reject(b"no").unwrap();
        let mem = iwarp::mem::VecMemory::new();
        qp.poll_transmit(now, &mem, 4096);
        let mut out = Vec::new();
        qp.txq()
            .for_each_slice(&mem, |s| {
                out.extend_from_slice(s);
                true
            })
            .unwrap();
        tcp.write_all(&out).unwrap();
        let _ = tcp.read(&mut buf);
    });
    let e = SdpStream::connect(addr).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(111), "{e}");
    server.join().unwrap();
}

#[test]
fn abortive_close_resets_and_writes_after_shutdown_fail() {
    let (a, b) = pair();
    (&a).write_all(b"some data").unwrap();
    let mut buf = [0; 64];
    assert_eq!((&b).read(&mut buf).unwrap(), 9);
    b.set_linger(Some(Duration::ZERO)).unwrap();
    drop(b);
    let e = (&a).read(&mut buf).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(104), "{e}"); // ECONNRESET
    let e = (&a).write(b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(32), "{e}"); // EPIPE

    let (a, b) = pair();
    a.shutdown(Shutdown::Write).unwrap();
    let e = (&a).write(b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(32), "{e}");
    assert_eq!((&b).read(&mut buf).unwrap(), 0);
    // The other direction still works.
    (&b).write_all(b"still here").unwrap();
    assert_eq!((&a).read(&mut buf).unwrap(), 10);
}

/// `close` ends the connection while another handle lives: the peer
/// reads what was written and then the end of the stream, the other
/// handle's write fails.
#[test]
fn close_ends_the_connection_whatever_other_handles_remain() {
    let (a, b) = pair();
    let kept = a.clone();
    (&a).write_all(b"last words").unwrap();
    a.close();
    let mut got = Vec::new();
    (&b).read_to_end(&mut got).unwrap();
    assert_eq!(got, b"last words");
    let e = (&kept).write(b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPIPE), "{e}");
}

#[test]
fn bytes_reach_the_peer_without_further_calls() {
    let (a, b) = pair();
    // More than the socket buffers take at once; the writer then sleeps
    // and the progress thread must move the rest.
    let data: Vec<u8> = (0..(3 << 20)).map(|k: u32| (k % 251) as u8).collect();
    let writer = std::thread::spawn(move || {
        a.set_nonblocking(true).unwrap();
        let mut off = 0;
        while off < data.len() {
            match (&a).write(&data[off..]) {
                Ok(n) => off += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(e) => panic!("{e}"),
            }
        }
        // Accepted, not necessarily sent: now do nothing at all.
        std::thread::sleep(Duration::from_secs(2));
        (a, data)
    });
    let mut got = Vec::new();
    let mut buf = vec![0; 1 << 16];
    b.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    while got.len() < 3 << 20 {
        let n = (&b).read(&mut buf).unwrap();
        got.extend_from_slice(&buf[..n]);
    }
    let (_a, data) = writer.join().unwrap();
    assert!(got == data);
}

#[test]
fn nonblocking_connect_turns_writable_and_reports_by_take_error() {
    let listener = SdpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || listener.accept().unwrap().0);
    let tcp = std::net::TcpStream::connect(addr).unwrap();
    let c = SdpStream::start_connect(tcp, &sdp_core::conn::Config::default()).unwrap();
    c.set_nonblocking(true).unwrap();
    // Writable once connected (the progress thread carries the setup on).
    assert_eq!(readiness(&c, PollFlags::OUT, 5000), (false, true));
    assert!(c.is_connected());
    assert!(c.take_error().unwrap().is_none());
    let s = server.join().unwrap();
    (&c).write_all(b"x").unwrap();
    let mut b = [0; 1];
    (&s).read_exact(&mut b).unwrap();
}

/// FIONREAD counts what arrived though no call read it yet, and only
/// once: asking again and again, with no read or wait in between, sees
/// the count grow to all that was sent and stop there.
#[test]
fn fionread_counts_arrivals_no_call_read() {
    let (a, b) = pair();
    let sent = scrambled(3 * 1000 + 17, 7);
    for part in sent.chunks(1000) {
        (&a).write_all(part).unwrap();
    }
    let t = Instant::now();
    let mut last = 0;
    while last < sent.len() as u64 {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "FIONREAD stuck at {last} of {}",
            sent.len()
        );
        let n = b.bytes_readable();
        assert!(n >= last, "FIONREAD went back from {last} to {n}");
        last = n;
        std::thread::yield_now();
    }
    assert_eq!(last, sent.len() as u64);
    assert_eq!(b.bytes_readable(), last);
    let mut got = vec![0; sent.len()];
    (&b).read_exact(&mut got).unwrap();
    assert_eq!(got, sent);
    assert_eq!(b.bytes_readable(), 0);
}

#[test]
fn urgent_byte_out_of_band() {
    use sdp_core::conn::{RecvFlags, SendFlags};
    let (a, b) = pair();
    a.send_flags(b"abc", SendFlags::EMPTY).unwrap();
    a.send_flags(b"!", SendFlags::OOB).unwrap();
    a.send_flags(b"de", SendFlags::EMPTY).unwrap();
    let mut buf = [0; 8];
    // The read stops at the mark; the urgent byte comes out of band.
    let t = Instant::now();
    while b.bytes_readable() < 5 {
        assert!(t.elapsed() < Duration::from_secs(5));
        let _ = b.recv_flags(&mut buf, RecvFlags::PEEK);
        std::thread::yield_now();
    }
    assert_eq!(b.recv_flags(&mut buf, RecvFlags::EMPTY).unwrap(), 3);
    assert!(b.at_mark());
    assert_eq!(b.recv_flags(&mut buf, RecvFlags::OOB).unwrap(), 1);
    assert_eq!(buf[0], b'!');
    assert_eq!(b.recv_flags(&mut buf, RecvFlags::EMPTY).unwrap(), 2);
    assert_eq!(&buf[..2], b"de");
}

#[test]
fn paused_streams_resume_detached_streams_leave_the_connection_alone() {
    use sdp_core::stream::readiness::Readiness;
    let listener = SdpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || listener.accept().unwrap().0);
    // A readiness descriptor handed out before the stream exists.
    let r = Readiness::new().unwrap();
    let user = r.user_fd().try_clone_to_owned().unwrap();
    let tcp = std::net::TcpStream::connect(addr).unwrap();
    let c =
        SdpStream::start_connect_with(tcp, &sdp_core::conn::Config::default(), Some(r)).unwrap();
    c.set_nonblocking(true).unwrap();
    let mut fds = [PollFd::new(&user, PollFlags::OUT)];
    poll(
        &mut fds,
        Some(&Timespec {
            tv_sec: 5,
            tv_nsec: 0,
        }),
    )
    .unwrap();
    assert!(fds[0].revents().contains(PollFlags::OUT));
    assert!(c.poll_state().connected && c.poll_state().writable);
    let s = server.join().unwrap();
    // Another descriptor adopted: it follows the stream from now on.
    let r = Readiness::new().unwrap();
    let user = r.user_fd().try_clone_to_owned().unwrap();
    c.adopt_readiness(r).unwrap();
    let mut fds = [PollFd::new(&user, PollFlags::OUT)];
    poll(&mut fds, Some(&Timespec::default())).unwrap();
    assert!(fds[0].revents().contains(PollFlags::OUT));

    // Paused: data waits in the socket until the stream is resumed.
    c.pause_progress();
    (&s).write_all(b"hello").unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let mut fds = [PollFd::new(&user, PollFlags::IN)];
    poll(&mut fds, Some(&Timespec::default())).unwrap();
    assert!(!fds[0].revents().contains(PollFlags::IN));
    c.resume_progress().unwrap();
    let mut fds = [PollFd::new(&user, PollFlags::IN)];
    poll(
        &mut fds,
        Some(&Timespec {
            tv_sec: 5,
            tv_nsec: 0,
        }),
    )
    .unwrap();
    assert!(fds[0].revents().contains(PollFlags::IN));
    let st = c.poll_state();
    assert!(st.readable && !st.read_closed && !st.hangup && !st.error);
    let mut buf = [0u8; 8];
    assert_eq!(
        c.recv_flags(&mut buf, sdp_core::conn::RecvFlags::EMPTY)
            .unwrap(),
        5
    );
    let info = c.info();
    assert_eq!((info.bytes_received, info.bytes_sent), (5, 0));

    // Detached: no DisConn, no reset; the peer sees nothing until the
    // socket itself closes.
    let raw = c.socket_fd();
    // SAFETY: the stream's socket, open until `detach` below.
    let keep = rustix::io::dup(unsafe { std::os::fd::BorrowedFd::borrow_raw(raw) }).unwrap();
    c.detach();
    s.set_nonblocking(true).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let e = (&s).read(&mut buf).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
    drop(keep);
    std::thread::sleep(Duration::from_millis(100));
    // Now the TCP connection ended without a DisConn: a reset for SDP.
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let e = (&s).read(&mut buf).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::ConnectionReset);
}

/// DESIGN §7 over real sockets: a 64-byte ping-pong sends every message
/// straight from the writer's buffer (the socket takes it at once, nothing
/// is staged), and every byte received either landed in the waiting
/// reader's buffer or was copied from a Private Buffer once — the
/// counters add up to the bytes moved, and direct placement happened.
/// `rounds` 64-byte messages from `c`, each echoed by `s` and compared;
/// then what `report` says of the client and of the server.
fn ping_pong<T: Send + 'static>(
    c: SdpStream,
    s: SdpStream,
    rounds: u64,
    report: fn(&SdpStream) -> T,
) -> (T, T) {
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        while (&s).read_exact(&mut buf).is_ok() {
            (&s).write_all(&buf).unwrap();
        }
        report(&s)
    });
    let mut buf = [0u8; 64];
    for i in 0..rounds {
        let msg = [(i % 251) as u8; 64];
        (&c).write_all(&msg).unwrap();
        (&c).read_exact(&mut buf).unwrap();
        assert_eq!(buf, msg);
    }
    c.shutdown(Shutdown::Write).unwrap();
    let server = echo.join().unwrap();
    (report(&c), server)
}

#[test]
fn pingpong_counts_its_copies() {
    let (c, s) = pair();
    const ROUNDS: u64 = 2000;
    let (client, server) = ping_pong(c, s, ROUNDS, |s| s.info().copies);
    for (who, k) in [("client", client), ("server", server)] {
        assert_eq!(k.bytes_staged, 0, "{who}: {k:?}");
        assert_eq!(k.bytes_sent_direct, ROUNDS * 64, "{who}: {k:?}");
        assert_eq!(
            k.bytes_received_direct + k.bytes_copied_from_pool,
            ROUNDS * 64,
            "{who}: {k:?}"
        );
        assert!(k.bytes_received_direct > 0, "{who}: {k:?}");
    }
}

/// A blocking reader polls its socket before it sleeps for as long as
/// `busy_poll_us` says: with a budget far above a round trip every wait
/// of a ping-pong ends while polling, with none it sleeps each time; the
/// bytes are the same either way.
#[test]
fn a_reader_polls_before_it_sleeps_as_configured() {
    const ROUNDS: u64 = 500;
    let run = |busy_poll_us| {
        let (c, s) = pair_with(&sdp_core::conn::Config {
            busy_poll_us,
            ..Default::default()
        });
        let waits = |s: &SdpStream| {
            let k = s.counters();
            (k.waits_polled, k.waits_slept)
        };
        let (client, server) = ping_pong(c, s, ROUNDS, waits);
        [client, server]
    };
    let [(polled, slept), _] = run(0);
    assert_eq!(polled, 0);
    assert!(slept > 0, "the client's reads never waited");
    let [client, server] = run(1_000_000);
    for (who, (polled, slept)) in [("client", client), ("server", server)] {
        // The server's first read waits for the client's first message and
        // its last for the end of the stream: both may sleep past a timer.
        assert!(
            polled >= ROUNDS / 2 && slept <= 2,
            "{who}: {polled} polled, {slept} slept"
        );
    }
}

/// Bulk in both copy paths: writes larger than the socket takes at once
/// (the rest staged) and reads of odd sizes; the bytes arrive intact and
/// the counters add up.
#[test]
fn bulk_transfer_counts_its_copies() {
    let (c, s) = pair();
    let data = scrambled(24 << 20, 13);
    let len = data.len() as u64;
    let reader = std::thread::spawn(move || {
        let mut got = Vec::with_capacity(24 << 20);
        let mut buf = vec![0; 100_003];
        loop {
            match (&s).read(&mut buf).unwrap() {
                0 => break,
                n => got.extend_from_slice(&buf[..n]),
            }
        }
        (got, s.info().copies)
    });
    for chunk in data.chunks(300_007) {
        (&c).write_all(chunk).unwrap();
    }
    c.shutdown(Shutdown::Write).unwrap();
    let (got, rx) = reader.join().unwrap();
    assert!(got == data);
    let tx = c.info().copies;
    assert_eq!(tx.bytes_sent_direct + tx.bytes_staged, len, "{tx:?}");
    assert_eq!(
        rx.bytes_received_direct + rx.bytes_copied_from_pool,
        len,
        "{rx:?}"
    );
}

/// A nonblocking reader that polls the socket itself (as the preload's
/// `select` and `poll` do) reads what the socket holds straight into its
/// own buffer: the pump that tells it of an arrival reads one message into
/// a Private Buffer and leaves the rest in the socket for the read. And
/// readiness stays exact: a read after the stream polled readable finds
/// bytes (or the end), never EAGAIN.
#[test]
fn a_polling_reader_takes_the_socket_into_its_own_buffer() {
    let (c, s) = pair();
    let data = scrambled(32 << 20, 11);
    let len = data.len() as u64;
    // The reader polls before the first byte is sent: what arrives while
    // nobody polls the socket is the progress thread's to read, into the
    // Private Buffers (up to a window's worth, copied by the first read).
    s.set_nonblocking(true).unwrap();
    s.poll_socket();
    let writer = {
        let data = data.clone();
        std::thread::spawn(move || {
            for chunk in data.chunks(1 << 20) {
                (&c).write_all(chunk).unwrap();
            }
            c.shutdown(Shutdown::Write).unwrap();
            c
        })
    };
    // SAFETY: the stream's socket stays open while `s` lives.
    let sock = unsafe { rustix::fd::BorrowedFd::borrow_raw(s.socket_fd()) };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut got = Vec::with_capacity(data.len());
    let mut buf = vec![0; 1 << 20];
    let mut reads = 0;
    let mut most_copied = 0;
    loop {
        assert!(Instant::now() < deadline, "stuck after {} bytes", got.len());
        if !s.poll_state().readable {
            let mut fds = [
                PollFd::new(&sock, PollFlags::IN),
                PollFd::new(&s, PollFlags::IN),
            ];
            let ts = Timespec {
                tv_sec: 1,
                tv_nsec: 0,
            };
            poll(&mut fds, Some(&ts)).unwrap();
            if fds[0].revents().contains(PollFlags::IN) {
                s.pump_quietly();
            }
            continue;
        }
        reads += 1;
        let before = s.info().copies.bytes_copied_from_pool;
        match (&s).read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => panic!("read {reads} after the stream polled readable: {e}"),
        }
        if reads > 1 {
            most_copied = most_copied.max(s.info().copies.bytes_copied_from_pool - before);
        }
    }
    let c = writer.join().unwrap();
    assert!(got == data, "{} bytes, not the {len} sent", got.len());
    let rx = s.info().copies;
    assert_eq!(rx.bytes_received_direct + rx.bytes_copied_from_pool, len);
    // Each read copies at most the message that told of the arrival and
    // the start of the next one, read with its header (the read-ahead
    // grows with the reads, up to a message); the rest was in the socket
    // and went straight into `buf`. Drained into the Private Buffers, a
    // read would copy whatever the window held (up to 1 MiB), and nothing
    // would land directly. (Not the first read: until a read tells how
    // much the reader takes, a pump reads all the socket holds.)
    let message = u64::from(sdp_core::conn::Config::default().buf_size);
    assert!(
        most_copied <= 2 * message && rx.bytes_received_direct >= len / 4,
        "{rx:?} in {reads} reads, at most {most_copied} copied by one"
    );
    drop(c);
}

extern "C" fn ignore_signal(_: libc::c_int) {}

/// The name of the system call thread `tid` of this process sleeps in.
fn syscall_of(tid: libc::pid_t) -> Option<i64> {
    let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall")).ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// A socket call waits as its `Block` says, whatever the stream's mode:
/// not at all, until a deadline, or until its buffers are full
/// (`WAITALL`, scattered); a signal ends its wait with EINTR, and the
/// stream goes on.
#[test]
fn socket_calls_wait_as_their_block_says() {
    use sdp_core::conn::RecvFlags;
    use sdp_core::stream::Block;
    use std::io::IoSliceMut;
    let (mut a, b) = pair();
    b.set_nonblocking(true).unwrap();
    let mut one = [0u8; 4];
    let e = b
        .recv_vectored(
            &mut [IoSliceMut::new(&mut one)],
            RecvFlags::EMPTY,
            Block::Never,
        )
        .unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
    let start = Instant::now();
    let soon = Block::Until(Some(start + Duration::from_millis(30)));
    let e = b
        .recv_vectored(&mut [IoSliceMut::new(&mut one)], RecvFlags::EMPTY, soon)
        .unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
    assert!(start.elapsed() >= Duration::from_millis(30));

    // WAITALL fills both buffers from two writes.
    let writer = {
        let a = a.clone();
        std::thread::spawn(move || {
            (&a).write_all(b"hello").unwrap();
            std::thread::sleep(Duration::from_millis(20));
            (&a).write_all(b"world").unwrap();
        })
    };
    let (mut x, mut y) = ([0u8; 3], [0u8; 7]);
    let n = b
        .recv_vectored(
            &mut [IoSliceMut::new(&mut x), IoSliceMut::new(&mut y)],
            RecvFlags::WAITALL,
            Block::Until(None),
        )
        .unwrap();
    writer.join().unwrap();
    assert_eq!((n, &x, &y), (10, b"hel", b"loworld"));

    // A reader asleep in poll (the stream's poller) and a second one
    // asleep beside it: a signal ends either's wait with EINTR, and the
    // next read gets the bytes.
    // SAFETY: a plain handler without SA_RESTART; an all-zero sigaction
    // is valid before it is filled in.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = ignore_signal as extern "C" fn(libc::c_int) as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
    }
    let reader = |b: SdpStream| {
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            // SAFETY: plain calls about the calling thread.
            tx.send(unsafe { (libc::pthread_self(), libc::gettid()) })
                .unwrap();
            let mut buf = [0u8; 8];
            b.recv_vectored(
                &mut [IoSliceMut::new(&mut buf)],
                RecvFlags::EMPTY,
                Block::Until(None),
            )
            .map(|n| buf[..n].to_vec())
            .map_err(|e| e.raw_os_error())
        });
        (t, rx.recv().unwrap())
    };
    let (first, (first_thread, first_tid)) = reader(b.clone());
    let until = Instant::now() + Duration::from_secs(10);
    let sleeps_in = |tid, calls: &[i64], what: &str| {
        while !matches!(syscall_of(tid), Some(n) if calls.contains(&n)) {
            assert!(Instant::now() < until, "{what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    let interrupt = |t: &std::thread::JoinHandle<_>, thread| {
        while !t.is_finished() {
            assert!(Instant::now() < until, "the signal never ended the wait");
            // SAFETY: the thread is alive (not finished).
            unsafe { libc::pthread_kill(thread, libc::SIGUSR1) };
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    sleeps_in(
        first_tid,
        &[libc::SYS_poll, libc::SYS_ppoll],
        "the reader never slept in poll",
    );
    // A second reader meanwhile sleeps on the stream's bell (a futex): a
    // signal ends its wait as well, while the first polls on.
    let (second, (second_thread, second_tid)) = reader(b.clone());
    sleeps_in(
        second_tid,
        &[libc::SYS_futex],
        "the second reader never slept on the bell",
    );
    interrupt(&second, second_thread);
    assert_eq!(second.join().unwrap(), Err(Some(libc::EINTR)));
    assert!(!first.is_finished());
    interrupt(&first, first_thread);
    assert_eq!(first.join().unwrap(), Err(Some(libc::EINTR)));
    let (third, _) = reader(b.clone());
    a.write_all(b"ping").unwrap();
    assert_eq!(third.join().unwrap(), Ok(b"ping".to_vec()));
}

/// A blocking write larger than `Config::lend_above` sends its Data
/// Messages straight from the caller's buffer and returns once all of it
/// is in Sends; against a reader that stopped, it stops lending once no
/// credit came for `LENT_STALL` and copies what the send buffer takes,
/// and its SO_SNDTIMEO leaves out of the stream the rest: the write
/// returns the bytes the stream kept — which the reader then gets,
/// followed by the next write, and nothing else.
#[test]
fn a_lent_write_times_out_with_what_the_stream_kept() {
    let (c, s) = lending_pair();
    let data = scrambled(8 << 20, 11);
    // The reader is not reading: credits run out after its buffers.
    c.set_write_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let t = Instant::now();
    let kept = (&c).write(&data).unwrap();
    assert!(t.elapsed() >= Duration::from_millis(100));
    assert!(kept > 0 && kept < data.len(), "{kept}");
    let copies = c.info().copies;
    // The send buffer (1 MiB) took some of what credits held back.
    assert!(
        copies.bytes_staged > 0 && copies.bytes_staged <= 1 << 20,
        "{copies:?}"
    );
    assert_eq!(
        copies.bytes_sent_direct + copies.bytes_staged,
        kept as u64,
        "{copies:?}"
    );
    // The send buffer is full: the next write waits for the reader.
    let reader = std::thread::spawn(move || {
        let mut got = Vec::new();
        (&s).read_to_end(&mut got).unwrap();
        got
    });
    c.set_write_timeout(None).unwrap();
    (&c).write_all(b"after the timeout").unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    let got = reader.join().unwrap();
    let mut want = data[..kept].to_vec();
    want.extend_from_slice(b"after the timeout");
    assert!(got == want, "{} bytes, want {}", got.len(), want.len());
}

/// Lent writes carry a stream intact when the reader keeps up, straight
/// from the writer's buffers (nine tenths at least: a reader that this
/// loaded machine keeps off its core for `LENT_STALL` has the rest of one
/// write copied).
#[test]
fn lent_writes_carry_a_stream() {
    let (c, s) = lending_pair();
    let data = scrambled(48 << 20, 7);
    let reader = std::thread::spawn(move || {
        let mut got = Vec::new();
        (&s).read_to_end(&mut got).unwrap();
        got
    });
    for chunk in data.chunks((1 << 20) + 17) {
        (&c).write_all(chunk).unwrap();
    }
    c.shutdown(Shutdown::Write).unwrap();
    assert!(reader.join().unwrap() == data);
    let copies = c.info().copies;
    let len = data.len() as u64;
    assert_eq!(
        copies.bytes_sent_direct + copies.bytes_staged,
        len,
        "{copies:?}"
    );
    assert!(copies.bytes_sent_direct >= len / 10 * 9, "{copies:?}");
}

/// Two peers that each write 1.5 MiB before they read both get through,
/// as over TCP, whose socket buffers take the bytes: a large blocking
/// write copies what credits hold back into the send buffer and returns —
/// at once without lending, after `LENT_STALL` when lent (the default).
#[test]
fn both_peers_write_before_reading() {
    let no_lending = sdp_core::conn::Config {
        lend_above: u64::MAX,
        ..Default::default()
    };
    for (c, s) in [pair(), pair_with(&no_lending)] {
        both_write_then_read(c, s);
    }
}

fn both_write_then_read(c: SdpStream, s: SdpStream) {
    let data: Vec<u8> = (0..(3u32 << 19)).map(|k| (k >> 5) as u8).collect();
    let (tx, rx) = std::sync::mpsc::channel();
    for me in [c.try_clone().unwrap(), s.try_clone().unwrap()] {
        let (tx, data) = (tx.clone(), data.clone());
        std::thread::spawn(move || {
            (&me).write_all(&data).unwrap();
            let mut got = vec![0; data.len()];
            (&me).read_exact(&mut got).unwrap();
            tx.send(got == data).unwrap();
        });
    }
    for _ in 0..2 {
        let ok = rx.recv_timeout(Duration::from_secs(20));
        assert_eq!(ok, Ok(true));
    }
    drop((c, s));
}

#[test]
fn a_credit_bound_writer_takes_only_what_credit_carries() {
    let (a, b) = pair();
    a.set_nonblocking(true).unwrap();
    a.set_credit_bound(true);
    let data = scrambled(8 << 20, 11);
    let chunk = 256 << 10;
    // The peer does not read yet: the writer stops once the peer's
    // buffers are spoken for, every byte it took already in a message
    // (none waits in the send buffer for credit).
    let mut at = 0;
    loop {
        match (&a).write(&data[at..at + chunk]) {
            Ok(n) => at += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("{e}"),
        }
    }
    let info = a.info();
    assert!(at > 0);
    assert_eq!(info.bytes_sent, at as u64, "{info:?}");
    assert!(info.credits.send_credit < 3, "{info:?}");
    assert_eq!(
        readiness(&a, PollFlags::IN | PollFlags::OUT, 0),
        (false, false)
    );
    // A small write still goes in, to travel with the next credit.
    assert_eq!((&a).write(&data[at..at + 100]).unwrap(), 100);
    at += 100;
    assert_eq!(a.info().bytes_sent, at as u64 - 100);
    // The peer reads; the writer waits for POLLOUT between its writes.
    let len = data.len();
    let reader = std::thread::spawn(move || {
        let mut got = Vec::with_capacity(len);
        let mut buf = vec![0; 100_003];
        loop {
            match (&b).read(&mut buf).unwrap() {
                0 => break got,
                n => got.extend_from_slice(&buf[..n]),
            }
        }
    });
    let t = Instant::now();
    while at < len {
        let end = (at + chunk).min(len);
        match (&a).write(&data[at..end]) {
            Ok(n) => at += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                assert!(
                    t.elapsed() < Duration::from_secs(20),
                    "stuck at {at}: {:?}",
                    a.info()
                );
                readiness(&a, PollFlags::OUT, 1000);
            }
            Err(e) => panic!("{e}"),
        }
    }
    a.shutdown(Shutdown::Write).unwrap();
    let got = reader.join().unwrap();
    assert!(got == data, "{} of {len} bytes, or not the same", got.len());
}

#[test]
fn private_buffers_fit_one_fpdu_at_the_mss_tcp_settles_on() {
    use iwarp::wire::{ddp::UNTAGGED_HEADER_LEN, fpdu};
    use std::net::TcpStream;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (s, _) = listener.accept().unwrap();
    let fit = sdp_core::stream::fit_config(&s, &sdp_core::conn::Config::default());
    // Data flows until the sender's MSS has grown (the window with it).
    let mss = |t: &TcpStream| socket2::SockRef::from(t).tcp_mss().unwrap() as usize;
    let first = mss(&c);
    let drain = std::thread::spawn(move || {
        let mut buf = vec![0; 1 << 20];
        while (&s).read(&mut buf).unwrap() > 0 {}
    });
    // It grows in steps (Linux: half the largest window seen): settled
    // once 16 MiB more changed nothing.
    let chunk = vec![7u8; 1 << 20];
    let t = Instant::now();
    let mut settled = first;
    let mut same = 0;
    while same < 16 && t.elapsed() < Duration::from_secs(10) {
        (&c).write_all(&chunk).unwrap();
        let now = mss(&c);
        same = if now == settled { same + 1 } else { 0 };
        settled = now;
    }
    c.shutdown(Shutdown::Write).unwrap();
    drain.join().unwrap();
    // A full message (the whole Private Buffer) is one FPDU then, and
    // nearly a full one: not one sized for the MSS TCP started with.
    assert!(settled > first, "TCP's MSS stayed at {first}");
    let message = fit.buf_size as usize + UNTAGGED_HEADER_LEN;
    let most = fpdu::mulpdu(settled, false);
    assert!(message <= most, "{fit:?} {first} {settled}");
    assert!(message + 1024 > most, "{fit:?} {first} {settled}");
}

/// A pair whose writers hold a short tail back for `wait` (DESIGN §7
/// "Small messages").
fn coalescing_pair(wait: Duration) -> (SdpStream, SdpStream) {
    pair_with(&sdp_core::conn::Config {
        coalesce: wait,
        ..Default::default()
    })
}

/// Writes `writes` buffers of 65 536 bytes (a message's payload and a
/// little more), each once the reader has all but the last write's
/// worth (so credit never runs short and gathers writes in the send
/// buffer), and closes; returns the messages the writer sent, after
/// checking that the reader got the stream whole.
fn stream_of_64k_writes(a: SdpStream, b: SdpStream, writes: usize) -> u32 {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let data = scrambled((writes * 65_536) as u32, 9);
    let len = data.len();
    let read = Arc::new(AtomicUsize::new(0));
    let reader = {
        let read = read.clone();
        std::thread::spawn(move || {
            let mut got = Vec::with_capacity(len);
            let mut buf = vec![0; 1 << 20];
            loop {
                match (&b).read(&mut buf).unwrap() {
                    0 => break got,
                    n => got.extend_from_slice(&buf[..n]),
                }
                read.store(got.len(), Ordering::SeqCst);
            }
        })
    };
    let before = a.info().credits.lsseq;
    let t = Instant::now();
    for (i, w) in data.chunks(65_536).enumerate() {
        while read.load(Ordering::SeqCst) + 65_536 < i * 65_536 {
            assert!(t.elapsed() < Duration::from_secs(20), "{:?}", a.info());
            std::thread::yield_now();
        }
        (&a).write_all(w).unwrap();
    }
    a.shutdown(Shutdown::Write).unwrap();
    let got = reader.join().unwrap();
    assert!(got == data, "{} of {len} bytes, or not the same", got.len());
    a.info().credits.lsseq.wrapping_sub(before)
}

#[test]
fn a_stream_of_writes_fills_its_messages_unless_nodelay() {
    let writes = 64;
    // A wait no write of the test comes near, so no tail goes alone.
    let (a, b) = coalescing_pair(Duration::from_secs(5));
    let coalesced = stream_of_64k_writes(a, b, writes);
    let (a, b) = coalescing_pair(Duration::from_secs(5));
    a.set_nodelay(true).unwrap();
    assert!(a.nodelay().unwrap());
    let nodelay = stream_of_64k_writes(a, b, writes);
    // A message carries a little less than 64 KiB: each write is a full
    // message and a short one, unless the short one waits for the next
    // write (plus the odd credit update either way).
    assert!(
        nodelay >= 2 * writes as u32,
        "{nodelay} messages with TCP_NODELAY"
    );
    assert!(
        coalesced <= writes as u32 + writes as u32 / 8,
        "{coalesced} messages for {writes} writes"
    );
}

#[test]
fn a_held_tail_goes_when_its_writer_waits_to_read() {
    // The wait is far longer than the test's limit: only the read can
    // send the tail.
    let (a, b) = coalescing_pair(Duration::from_secs(30));
    let data = scrambled(300_000, 7);
    let len = data.len();
    let server = std::thread::spawn(move || {
        let mut got = vec![0; len];
        (&b).read_exact(&mut got).unwrap();
        (&b).write_all(b"!").unwrap();
        got
    });
    let t = Instant::now();
    for w in data.chunks(100_000) {
        (&a).write_all(w).unwrap();
    }
    let mut answer = [0u8; 1];
    a.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    (&a).read_exact(&mut answer).unwrap();
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", a.info());
    assert!(server.join().unwrap() == data);
}

#[test]
fn a_held_tail_goes_on_its_own_when_nothing_follows() {
    let (a, b) = coalescing_pair(Duration::from_millis(20));
    let data = scrambled(300_000, 5);
    for w in data.chunks(100_000) {
        (&a).write_all(w).unwrap();
    }
    // The writer leaves the stream alone: the progress thread sends the
    // tail once its wait is over.
    b.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut got = vec![0; data.len()];
    (&b).read_exact(&mut got).unwrap();
    assert!(got == data);
    drop(a);
}

#[test]
fn two_stuck_writers_fall_quiet() {
    // Both ends write without reading until neither takes a byte (the
    // other's application holds its buffers), twice round, then wait.
    // Their credit requests must not answer each other for ever.
    let mut busy = Vec::new();
    for _ in 0..12 {
        let (a, b) = pair();
        for s in [&a, &b] {
            s.set_nonblocking(true).unwrap();
            s.set_credit_bound(true);
        }
        let chunk = vec![7u8; 65_536];
        for _ in 0..2 {
            for s in [&a, &b] {
                while let Ok(n) = (&*s).write(&chunk) {
                    assert!(n > 0);
                }
            }
        }
        let sent = |a: &SdpStream, b: &SdpStream| {
            a.info().credits.lsseq as u64 + b.info().credits.lsseq as u64
        };
        std::thread::sleep(Duration::from_millis(50));
        let before = sent(&a, &b);
        std::thread::sleep(Duration::from_millis(200));
        busy.push(sent(&a, &b) - before);
    }
    assert!(
        busy.iter().all(|&n| n < 20),
        "messages sent while idle: {busy:?}"
    );
}

#[test]
fn a_gathered_write_fills_messages_across_the_callers_buffers() {
    use sdp_core::stream::Block;
    use std::io::IoSlice;
    let (a, b) = pair();
    let data = scrambled(300_000, 3);
    let len = data.len();
    let reader = std::thread::spawn(move || {
        let mut got = Vec::with_capacity(len);
        (&b).read_to_end(&mut got).unwrap();
        got
    });
    // 150 buffers of 1 to 3 999 bytes: more than one send takes, none a
    // message's worth.
    let mut pieces = Vec::new();
    let mut at = 0;
    for k in 0.. {
        let n = (1 + (k * 2_654_435_761u64 as usize) % 3_999).min(len - at);
        pieces.push(&data[at..at + n]);
        at += n;
        if at == len {
            break;
        }
    }
    let mut bufs: Vec<IoSlice<'_>> = pieces.iter().map(|p| IoSlice::new(p)).collect();
    let before = a.info().credits.lsseq;
    let mut left = &mut bufs[..];
    let mut calls = 0;
    while !left.is_empty() {
        let n = a
            .send_vectored(left, sdp_core::conn::SendFlags::EMPTY, Block::Until(None))
            .unwrap();
        assert!(n > 0);
        IoSlice::advance_slices(&mut left, n);
        calls += 1;
    }
    a.shutdown(Shutdown::Write).unwrap();
    let got = reader.join().unwrap();
    assert!(got == data, "{} of {len} bytes, or not the same", got.len());
    let info = a.info();
    let messages = info.credits.lsseq.wrapping_sub(before);
    // A blocking call takes every byte, whatever the number of buffers;
    // full messages (about 64 KiB each), not one per buffer.
    assert!(pieces.len() > 64);
    assert_eq!(calls, 1);
    assert!(
        messages <= 12,
        "{messages} messages for {} buffers",
        pieces.len()
    );
    assert_eq!(
        info.copies.bytes_sent_direct + info.copies.bytes_staged,
        len as u64,
        "{info:?}"
    );
}
