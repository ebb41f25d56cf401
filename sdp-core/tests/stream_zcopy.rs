//! Zcopy through SdpStream over loopback (draft §9.2, §9.3): large
//! blocking writes against large blocking reads move by Read Zcopy or
//! Write Zcopy, the bytes arrive intact, and the counters say which
//! mechanism carried them.

use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::net::Shutdown;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use sdp_core::conn::{Config, Pipelining, RecvFlags, SendFlags};
use sdp_core::stream::{Block, SdpListener, SdpStream};

const MIB: usize = 1 << 20;

fn pair_with(client: &Config, server: &Config) -> (SdpStream, SdpStream) {
    let listener = SdpListener::bind_with("127.0.0.1:0", server).unwrap();
    let addr = listener.local_addr().unwrap();
    let t = std::thread::spawn(move || listener.accept().unwrap().0);
    let c = SdpStream::connect_with(addr, client).unwrap();
    (c, t.join().unwrap())
}

fn data(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|k| (k.wrapping_add(seed).wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect()
}

/// A Data Source that enters Pipelined Mode at once (Write Zcopy into
/// posted reads).
fn pipelined() -> Config {
    Config {
        pipelining: Pipelining::Always,
        ..zcopy_config()
    }
}

fn zcopy_config() -> Config {
    Config {
        bcopy_threshold: 256 * 1024,
        read_zcopy: true,
        write_zcopy: true,
        ..Config::default()
    }
}

/// 64 MiB in 16 MiB writes against 16 MiB reads, Combined Mode: every
/// buffer goes by SrcAvail and the reader's RDMA Reads (but the payload
/// a Combined Mode SrcAvail carries).
#[test]
fn large_writes_move_by_read_zcopy() {
    let (c, s) = pair_with(&zcopy_config(), &zcopy_config());
    let sent = data(64 * MIB, 1);
    let reader = std::thread::spawn(move || {
        let mut got = Vec::with_capacity(64 * MIB);
        let mut buf = vec![0; 16 * MIB];
        loop {
            match (&s).read(&mut buf).unwrap() {
                0 => break,
                n => got.extend_from_slice(&buf[..n]),
            }
        }
        (got, s.info())
    });
    for chunk in sent.chunks(16 * MIB) {
        (&c).write_all(chunk).unwrap();
    }
    c.shutdown(Shutdown::Write).unwrap();
    let (got, rx) = reader.join().unwrap();
    assert!(got == sent, "{} bytes of {}", got.len(), sent.len());
    let tx = c.info().zcopy;
    let len = sent.len() as u64;
    assert_eq!(
        tx.bcopy_sent + tx.read_zcopy_sent + tx.write_zcopy_sent,
        len,
        "{tx:?}"
    );
    assert!(tx.read_zcopy_sent >= len - 4 * 1024, "{tx:?}");
    assert_eq!(
        rx.zcopy.read_zcopy_received, tx.read_zcopy_sent,
        "{:?}",
        rx.zcopy
    );
    assert_eq!(rx.zcopy.send_sms, 0, "{:?}", rx.zcopy);
}

/// A receive posted before the send, Pipelined Mode: the reader's buffer
/// is advertised by SinkAvail and the writer's RDMA Write places the
/// payload straight into it — no byte of it is copied on receive.
#[test]
fn posted_receive_moves_by_write_zcopy_without_a_copy() {
    let client = pipelined();
    let (c, s) = pair_with(&client, &zcopy_config());
    let sent = data(16 * MIB, 2);
    let s2 = s.clone();
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0; 16 * MIB];
        let n = (&s2).read(&mut buf).unwrap();
        buf.truncate(n);
        buf
    });
    // The read is posted and advertised before anything is written.
    while s.info().zcopy.sink_avails == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    (&c).write_all(&sent).unwrap();
    let got = reader.join().unwrap();
    assert!(got == sent, "{} bytes", got.len());
    let rx = s.info();
    assert_eq!(rx.zcopy.write_zcopy_received, sent.len() as u64, "{rx:?}");
    assert_eq!(rx.copies.bytes_copied_from_pool, 0, "{rx:?}");
    assert_eq!(rx.copies.bytes_received_direct, 0, "{rx:?}");
    assert_eq!(c.info().zcopy.write_zcopy_sent, sent.len() as u64);
}

// ----- The entries for a caller that blocks on its own (the preload) -----

extern "C" fn ignore(_: libc::c_int) {}

/// SIGUSR1 runs a handler that does nothing, without SA_RESTART: a
/// blocking call it interrupts ends with EINTR.
fn install_sigusr1() {
    // SAFETY: a zeroed sigaction with a plain handler and an empty mask.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = ignore as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
    }
}

/// Sends SIGUSR1 to `thread` until `done` says its call returned (a
/// signal that lands just before the call sleeps interrupts nothing).
fn interrupt_until<T>(thread: libc::pthread_t, done: &std::sync::mpsc::Receiver<T>) -> T {
    loop {
        // SAFETY: the thread is alive until it sent on `done`.
        unsafe { libc::pthread_kill(thread, libc::SIGUSR1) };
        if let Ok(v) = done.recv_timeout(Duration::from_millis(20)) {
            return v;
        }
    }
}

/// Waits until `ok` holds (a call in another thread got that far), for
/// 10 s at most.
fn until(what: &str, ok: impl Fn() -> bool) {
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while !ok() {
        assert!(std::time::Instant::now() < end, "still waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn nonblocking_pair(client: &Config, server: &Config) -> (SdpStream, SdpStream) {
    let (c, s) = pair_with(client, server);
    c.set_nonblocking(true).unwrap();
    s.set_nonblocking(true).unwrap();
    (c, s)
}

/// Sleeps until the readiness descriptor of `s` is readable (10 s at
/// most).
fn await_readable(s: &SdpStream) {
    let mut fds = [PollFd::new(s, PollFlags::IN)];
    let ten = Timespec {
        tv_sec: 10,
        tv_nsec: 0,
    };
    let n = poll(&mut fds, Some(&ten)).unwrap();
    assert!(n == 1, "not readable: {}", s.debug_state());
}

/// One byte from `c` to `s`: the client's ModeChange, sent first, has
/// reached the server, whose receive half is now in Pipelined Mode.
fn settle(c: &SdpStream, s: &SdpStream) {
    assert_eq!((&*c).write(b"x").unwrap(), 1);
    let mut b = [0u8; 1];
    loop {
        match (&*s).read(&mut b) {
            Ok(1) => return,
            Ok(n) => panic!("read {n}"),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => await_readable(s),
            Err(e) => panic!("read: {e}"),
        }
    }
}

/// Reads everything until the end of the stream, by Bcopy, sleeping on
/// the stream's readiness (the stream itself is nonblocking).
fn read_to_end_nonblocking(s: &SdpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = vec![0; MIB];
    loop {
        match (&*s).read(&mut buf) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => await_readable(s),
            Err(e) => panic!("read: {e}"),
        }
    }
}

/// A socket call's blocking `send` of `buf` (a large one is lent).
fn send_blocking(c: &SdpStream, buf: &[u8], deadline: Option<Instant>) -> std::io::Result<usize> {
    c.send_vectored(
        &[IoSlice::new(buf)],
        SendFlags::EMPTY,
        Block::Until(deadline),
    )
}

/// A socket call's blocking `recv` into `buf` (a large one is posted).
fn recv_blocking(
    s: &SdpStream,
    buf: &mut [u8],
    deadline: Option<Instant>,
) -> std::io::Result<usize> {
    s.recv_vectored(
        &mut [IoSliceMut::new(buf)],
        RecvFlags::EMPTY,
        Block::Until(deadline),
    )
}

/// `data` written by a blocking send from another thread, then the end
/// of the stream, read at `s` with [`read_to_end_nonblocking`].
fn write_zcopy_then_read_to_end(c: &SdpStream, s: &SdpStream, data: Vec<u8>) -> Vec<u8> {
    let c = c.clone();
    let writer = std::thread::spawn(move || {
        assert_eq!(send_blocking(&c, &data, None).unwrap(), data.len());
        c.shutdown(Shutdown::Write).unwrap();
    });
    let got = read_to_end_nonblocking(s);
    writer.join().unwrap();
    got
}

/// A blocking receive on a nonblocking stream posts the buffer before it waits:
/// once the SinkAvail is out, a write lands in the buffer by RDMA Write,
/// nothing copied.
#[test]
fn read_zcopy_posts_before_waiting_and_is_written_into() {
    let client = pipelined();
    let (c, s) = nonblocking_pair(&client, &zcopy_config());
    settle(&c, &s);
    let sent = data(16 * MIB, 3);
    let s2 = s.clone();
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0; 16 * MIB];
        let n = recv_blocking(&s2, &mut buf, None).unwrap();
        buf.truncate(n);
        buf
    });
    until("the SinkAvail", || s.info().zcopy.sink_avails == 1);
    let copied = s.info().copies.bytes_copied_from_pool;
    assert_eq!(send_blocking(&c, &sent, None).unwrap(), sent.len());
    let got = reader.join().unwrap();
    assert!(got == sent, "{} bytes", got.len());
    let rx = s.info();
    assert_eq!(rx.zcopy.write_zcopy_received, sent.len() as u64, "{rx:?}");
    assert_eq!(rx.copies.bytes_copied_from_pool, copied, "{rx:?}");
    assert_eq!(c.info().zcopy.write_zcopy_sent, sent.len() as u64);
}

/// Below the Bcopy Threshold, or with Zcopy off, blocking calls lend and
/// post nothing: they go by Bcopy.
#[test]
fn small_buffers_and_zcopy_off_go_by_bcopy() {
    let (c, s) = nonblocking_pair(&zcopy_config(), &Config::default());
    assert_eq!(send_blocking(&c, &[7; 1024], None).unwrap(), 1024);
    let soon = || Some(Instant::now() + Duration::from_millis(20));
    let mut buf = vec![0; 4 * MIB];
    // The server side has Zcopy off.
    assert_eq!(recv_blocking(&s, &mut buf, None).unwrap(), 1024);
    let e = recv_blocking(&s, &mut buf, soon()).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
    let mut small = [0; 100];
    let e = recv_blocking(&c, &mut small, soon()).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
    let (cz, sz) = (c.info().zcopy, s.info().zcopy);
    assert_eq!((cz.src_avails, cz.sink_avails), (0, 0), "{cz:?}");
    assert_eq!((sz.src_avails, sz.sink_avails), (0, 0), "{sz:?}");
}

/// A deadline that passes with the buffer posted and advertised: the
/// SinkAvail is canceled (§9.5.5), the call says EAGAIN, and the stream
/// goes on intact.
#[test]
fn read_zcopy_deadline_cancels_and_the_stream_goes_on() {
    let client = pipelined();
    let (c, s) = nonblocking_pair(&client, &zcopy_config());
    settle(&c, &s);
    let mut buf = vec![0; 4 * MIB];
    let deadline = Some(Instant::now() + Duration::from_millis(50));
    let e = recv_blocking(&s, &mut buf, deadline).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
    assert_eq!(s.info().zcopy.cancels, 1, "{:?}", s.info().zcopy);
    let sent = data(8 * MIB, 4);
    let got = write_zcopy_then_read_to_end(&c, &s, sent.clone());
    assert!(got == sent, "{} bytes", got.len());
}

/// A signal while the read's buffer is advertised: the buffer is taken
/// back first (SinkAvailCancel, §9.5.5), then the call ends with EINTR;
/// what the peer writes afterwards arrives whole.
#[test]
fn a_signal_ends_a_posted_read_zcopy_with_eintr() {
    install_sigusr1();
    let client = pipelined();
    let (c, s) = nonblocking_pair(&client, &zcopy_config());
    settle(&c, &s);
    let (me_tx, me_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let s2 = s.clone();
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0; 4 * MIB];
        // SAFETY: the calling thread's own id.
        me_tx.send(unsafe { libc::pthread_self() }).unwrap();
        let r = recv_blocking(&s2, &mut buf, None);
        done_tx.send(r.map_err(|e| e.raw_os_error())).unwrap();
    });
    let thread = me_rx.recv().unwrap();
    until("the SinkAvail", || s.info().zcopy.sink_avails == 1);
    let r = interrupt_until(thread, &done_rx);
    reader.join().unwrap();
    assert_eq!(r, Err(Some(libc::EINTR)));
    let zc = s.info().zcopy;
    assert_eq!((zc.sink_avails, zc.cancels), (1, 1), "{zc:?}");
    let sent = data(8 * MIB, 5);
    let got = write_zcopy_then_read_to_end(&c, &s, sent.clone());
    assert!(got == sent, "{} bytes", got.len());
}

/// A signal while the write's SrcAvail waits for a reader that posts
/// nothing: the SrcAvail is canceled (§9.5.4), the call returns what the
/// stream kept (a Combined Mode SrcAvail's payload) or EINTR, and the
/// rest, written again, follows it intact.
#[test]
fn a_signal_ends_a_write_zcopy_once_its_srcavail_is_canceled() {
    install_sigusr1();
    let (c, s) = nonblocking_pair(&zcopy_config(), &zcopy_config());
    let sent = data(8 * MIB, 6);
    let (me_tx, me_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let writer = {
        let (c, sent) = (c.clone(), sent.clone());
        std::thread::spawn(move || {
            // SAFETY: the calling thread's own id.
            me_tx.send(unsafe { libc::pthread_self() }).unwrap();
            let r = send_blocking(&c, &sent, None);
            done_tx.send(r.map_err(|e| e.raw_os_error())).unwrap();
        })
    };
    let thread = me_rx.recv().unwrap();
    until("the SrcAvail", || c.info().zcopy.src_avails == 1);
    let r = interrupt_until(thread, &done_rx);
    writer.join().unwrap();
    let kept = match r {
        Ok(n) => n,
        Err(Some(libc::EINTR)) => 0,
        other => panic!("send: {other:?}"),
    };
    assert!(kept < sent.len(), "{kept}");
    let zc = c.info().zcopy;
    assert_eq!((zc.src_avails, zc.cancels), (1, 1), "{zc:?}");
    let rest = sent[kept..].to_vec();
    let got = write_zcopy_then_read_to_end(&c, &s, rest);
    assert!(got == sent, "{} bytes", got.len());
}

/// Blocking reads with buffers below the Bcopy Threshold against large
/// writes: each SrcAvail finds no posted buffer and the read that finds
/// nothing answers it with SendSm (§9.2 step 2a) before it sleeps, so the
/// writer goes on by Bcopy.
#[test]
fn small_blocking_reads_answer_srcavails_with_sendsm() {
    let (c, s) = pair_with(&zcopy_config(), &zcopy_config());
    let sent = data(16 * MIB, 7);
    let writer = {
        let (c, sent) = (c.clone(), sent.clone());
        std::thread::spawn(move || {
            for chunk in sent.chunks(4 * MIB) {
                (&c).write_all(chunk).unwrap();
            }
            c.shutdown(Shutdown::Write).unwrap();
        })
    };
    let mut got = Vec::new();
    let mut buf = vec![0; 64 * 1024];
    loop {
        match (&s).read(&mut buf).unwrap() {
            0 => break,
            n => got.extend_from_slice(&buf[..n]),
        }
    }
    writer.join().unwrap();
    assert!(got == sent, "{} bytes", got.len());
    let rx = s.info().zcopy;
    assert!(rx.send_sms > 0, "{rx:?}");
    assert_eq!(
        rx.read_zcopy_received + rx.write_zcopy_received,
        0,
        "{rx:?}"
    );
}

/// An epoll-style reader (nonblocking, sleeping on the readiness
/// descriptor) against a Pipelined Mode writer, whose SrcAvail carries no
/// data: the SrcAvail alone makes the stream readable, the read that finds
/// nothing answers it with SendSm, and the bytes follow by Bcopy. (Had the
/// progress thread taken the SrcAvail in, with no reader to answer it,
/// both ends would wait for each other.)
#[test]
fn a_srcavail_wakes_a_reader_sleeping_on_readiness() {
    let client = pipelined();
    let (c, s) = nonblocking_pair(&client, &zcopy_config());
    settle(&c, &s);
    let sent = data(8 * MIB, 8);
    let writer = {
        let (c, sent) = (c.clone(), sent.clone());
        std::thread::spawn(move || {
            for chunk in sent.chunks(2 * MIB) {
                assert_eq!(send_blocking(&c, chunk, None).unwrap(), chunk.len());
            }
            c.shutdown(Shutdown::Write).unwrap();
        })
    };
    let mut got = Vec::new();
    let mut buf = vec![0; 64 * 1024];
    loop {
        match (&s).read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => await_readable(&s),
            Err(e) => panic!("read: {e}"),
        }
    }
    writer.join().unwrap();
    assert!(got == sent, "{} bytes", got.len());
    // Two SrcAvails answered by SendSm; after them the writer sends its
    // buffers without asking (a Pipelined Mode Data Source skips the
    // SrcAvail a Data Sink keeps refusing).
    let zc = s.info().zcopy;
    assert_eq!(zc.send_sms, 2, "{zc:?}");
    assert_eq!(c.info().zcopy.src_avails, 2);
}

/// Both ends write and read at once, each with a writer and a reader
/// thread, in Pipelined Mode with Write Zcopy (the soak's duplex
/// connections), with signals landing in the calls every 2 ms: every
/// byte arrives in order at both ends. A side that stops moving for 20 s
/// has both connections' states printed.
#[test]
fn duplex_write_zcopy_moves_both_ways() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
    use std::sync::{Arc, Mutex};
    install_sigusr1();
    let mut config = Config::default();
    sdp_core::stream::zcopy::ZcopyMode::Write.apply(&mut config, 256 * 1024);
    // The workers' threads, signalled while they run.
    let live: Arc<Mutex<Vec<libc::pthread_t>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let signaller = {
        let (live, stop) = (live.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Relaxed) {
                for &t in live.lock().unwrap().iter() {
                    // SAFETY: a registered thread is alive until it
                    // takes itself out under this lock.
                    unsafe { libc::pthread_kill(t, libc::SIGUSR1) };
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    let enter = |live: &Mutex<Vec<libc::pthread_t>>| {
        // SAFETY: the calling thread's handle.
        live.lock().unwrap().push(unsafe { libc::pthread_self() });
    };
    let leave = |live: &Mutex<Vec<libc::pthread_t>>| {
        // SAFETY: the calling thread's handle.
        let me = unsafe { libc::pthread_self() };
        live.lock().unwrap().retain(|&t| t != me);
    };
    for round in 0..12u32 {
        let (c, s) = pair_with(&config, &config);
        let len = 8 * MIB + round as usize * 4099;
        let moved = Arc::new(AtomicU64::new(0));
        let mut threads = Vec::new();
        for (i, end) in [c.clone(), s.clone()].into_iter().enumerate() {
            let out = data(len, round * 2 + i as u32);
            let (w, m, l) = (end.clone(), moved.clone(), live.clone());
            threads.push(std::thread::spawn(move || {
                enter(&l);
                let sizes = [1024, 60_000, 300_000, MIB, 4 * MIB];
                let (mut off, mut k) = (0, round as usize + i);
                while off < out.len() {
                    let n = sizes[k % sizes.len()].min(out.len() - off);
                    k += 1;
                    std::thread::sleep(Duration::from_micros((k as u64 * 377) % 1500));
                    match send_blocking(&w, &out[off..off + n], None) {
                        Ok(sent) => {
                            off += sent;
                            m.fetch_add(sent as u64, Relaxed);
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => panic!("send: {e}"),
                    }
                }
                leave(&l);
            }));
            let (r, m, l) = (end.clone(), moved.clone(), live.clone());
            let want = data(len, round * 2 + (1 - i) as u32);
            threads.push(std::thread::spawn(move || {
                enter(&l);
                let mut got = vec![0u8; len];
                let sizes = [1000, 100_000, MIB, 4 * MIB];
                let (mut at, mut k) = (0, round as usize);
                while at < len {
                    let n = sizes[k % sizes.len()].min(len - at);
                    k += 1;
                    std::thread::sleep(Duration::from_micros((k as u64 * 613) % 1500));
                    match recv_blocking(&r, &mut got[at..at + n], None) {
                        Ok(0) => panic!("end of stream after {at} of {len}"),
                        Ok(n) => {
                            at += n;
                            m.fetch_add(n as u64, Relaxed);
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => panic!("recv: {e}"),
                    }
                }
                leave(&l);
                assert!(got == want, "round {round}: the bytes differ");
            }));
        }
        let mut last = (0, Instant::now());
        while threads.iter().any(|t| !t.is_finished()) {
            std::thread::sleep(Duration::from_millis(50));
            let now = moved.load(Relaxed);
            if now != last.0 {
                last = (now, Instant::now());
            } else if last.1.elapsed() > Duration::from_secs(20) {
                stop.store(true, Relaxed);
                panic!(
                    "round {round}: stuck after {now} bytes\nclient: {}\nserver: {}",
                    c.debug_state(),
                    s.debug_state()
                );
            }
        }
        for t in threads {
            t.join().unwrap();
        }
    }
    stop.store(true, Relaxed);
    signaller.join().unwrap();
}

// ----- The same-host path (DESIGN §9) -----

/// Both ends in one process, so on one host: the extension is on.
fn same_host(config: Config) -> Config {
    Config {
        local: true,
        ..config
    }
}

/// 64 MiB in 16 MiB writes against 16 MiB reads; with `fork_after`,
/// the writer's ring token is revoked after its first write, as a `fork`
/// of the writer does. Returns the bytes read and both ends' figures.
fn read_zcopy_on_one_host(
    fork_after: bool,
) -> (
    Vec<u8>,
    sdp_core::stream::StreamInfo,
    sdp_core::stream::StreamInfo,
) {
    let (c, s) = pair_with(&same_host(zcopy_config()), &same_host(zcopy_config()));
    let sent = data(64 * MIB, 5);
    let reader = std::thread::spawn(move || {
        let mut got = Vec::with_capacity(64 * MIB);
        let mut buf = vec![0; 16 * MIB];
        loop {
            match (&s).read(&mut buf).unwrap() {
                0 => break,
                n => got.extend_from_slice(&buf[..n]),
            }
        }
        (got, s.info())
    });
    for (i, chunk) in sent.chunks(16 * MIB).enumerate() {
        (&c).write_all(chunk).unwrap();
        if fork_after && i == 0 {
            c.revoke_local();
        }
    }
    c.shutdown(Shutdown::Write).unwrap();
    let (got, rx) = reader.join().unwrap();
    assert!(got == sent, "{} bytes of {}", got.len(), sent.len());
    (got, c.info(), rx)
}

/// Read Zcopy between two processes of one host: the reader takes each
/// SrcAvail's bytes from the writer's buffer itself, process to process,
/// not by RDMA Read over TCP — every byte of them.
#[test]
fn on_one_host_the_reader_reads_a_srcavails_buffer_itself() {
    let (got, tx, rx) = read_zcopy_on_one_host(false);
    let len = got.len() as u64;
    assert!(tx.zcopy.read_zcopy_sent >= len - 4 * 1024, "{tx:?}");
    assert_eq!(rx.zcopy.read_zcopy_received, tx.zcopy.read_zcopy_sent);
    assert_eq!(
        rx.copies.bytes_received_local, rx.zcopy.read_zcopy_received,
        "{rx:?}"
    );
}

/// The writer's ring token revoked after its first buffer (what a `fork`
/// of the writer does): the reader's next read finds it gone and the rest
/// goes by RDMA Read over TCP, nothing lost.
#[test]
fn on_one_host_a_revoked_token_sends_reads_back_to_the_wire() {
    let (got, tx, rx) = read_zcopy_on_one_host(true);
    let len = got.len() as u64;
    assert!(tx.zcopy.read_zcopy_sent >= len - 4 * 1024, "{tx:?}");
    assert_eq!(rx.zcopy.read_zcopy_received, tx.zcopy.read_zcopy_sent);
    let local = rx.copies.bytes_received_local;
    assert!(local >= 16 * MIB as u64 - 4096 && local < len / 2, "{rx:?}");
}

/// Write Zcopy between two processes of one host: the writer puts its
/// bytes into the reader's advertised buffer itself, nothing copied on
/// receive and nothing on the TCP connection but the messages.
#[test]
fn on_one_host_the_writer_writes_into_a_sinkavails_buffer_itself() {
    let (c, s) = pair_with(&same_host(pipelined()), &same_host(zcopy_config()));
    let sent = data(16 * MIB, 6);
    let s2 = s.clone();
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0; 16 * MIB];
        let n = (&s2).read(&mut buf).unwrap();
        buf.truncate(n);
        buf
    });
    while s.info().zcopy.sink_avails == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    (&c).write_all(&sent).unwrap();
    let got = reader.join().unwrap();
    assert!(got == sent, "{} bytes", got.len());
    let (tx, rx) = (c.info(), s.info());
    assert_eq!(rx.zcopy.write_zcopy_received, sent.len() as u64, "{rx:?}");
    assert_eq!(rx.copies.bytes_copied_from_pool, 0, "{rx:?}");
    assert_eq!(tx.zcopy.write_zcopy_sent, sent.len() as u64);
    assert_eq!(tx.copies.bytes_sent_local, sent.len() as u64, "{tx:?}");
}
