//! Who wakes whom when several application threads wait for one stream.

use std::io::{Read, Write};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::{Inner, DRAIN_LOOK};
use crate::stream::{SdpListener, SdpStream};

fn pair() -> (SdpStream, SdpStream) {
    let listener = SdpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let t = std::thread::spawn(move || listener.accept().unwrap().0);
    let c = SdpStream::connect(addr).unwrap();
    (c, t.join().unwrap())
}

/// Spins until `f` holds of the stream's state, looked at without waking
/// anyone (at most 10 s).
fn until(s: &SdpStream, f: impl Fn(&Inner) -> bool) {
    let end = Instant::now() + Duration::from_secs(10);
    while !f(&s.shared().lock_inner()) {
        assert!(Instant::now() < end, "the threads did not get there");
        std::thread::yield_now();
    }
}

/// A writer without credit sleeps in poll(2) on the socket, a reader of
/// the same stream on the condition variable. The peer's bytes wake the
/// writer, whose pump receives them; still without credit, it goes back
/// to poll(2) — and must wake the reader on the way, or both sleep while
/// the bytes wait (and the peer, whose credits are in those messages,
/// may wait too).
#[test]
fn a_poller_that_receives_for_the_reader_wakes_it() {
    const WRITTEN: usize = 4 << 20;
    let (c, s) = pair();
    let w = c.clone();
    let writer = std::thread::spawn(move || (&w).write_all(&vec![0x11; WRITTEN]).unwrap());
    // The peer reads nothing: its buffers and our send buffer fill up,
    // and the writer polls for the socket's input only.
    until(&c, |g| {
        g.poller_active && !g.link.writable() && g.ep.connection().txq().is_empty()
    });
    let (tx, rx) = mpsc::channel();
    let r = c.clone();
    let reader = std::thread::spawn(move || {
        let mut buf = [0; 64];
        let n = (&r).read(&mut buf).unwrap();
        tx.send(buf[..n].to_vec()).unwrap();
    });
    until(&c, |g| g.cond_waiters == 1);
    (&s).write_all(b"hello").unwrap();
    let got = rx.recv_timeout(Duration::from_secs(10));
    assert_eq!(got.as_deref(), Ok(&b"hello"[..]));
    let mut sink = vec![0; WRITTEN];
    (&s).read_exact(&mut sink).unwrap();
    writer.join().unwrap();
    reader.join().unwrap();
}

/// A blocking read that waits polls the socket itself, and so will the
/// next ones: from then on the progress thread leaves arrivals to the
/// application, or every message would wake it too.
#[test]
fn a_blocking_read_that_waits_takes_arrivals_from_the_progress_thread() {
    let (c, s) = pair();
    assert!(c.shared().reads(), "nobody reads the socket yet");
    let r = c.clone();
    let reader = std::thread::spawn(move || {
        let mut buf = [0; 5];
        (&r).read_exact(&mut buf).unwrap();
        buf
    });
    until(&c, |g| g.poller_active);
    assert!(!c.shared().reads());
    (&s).write_all(b"hello").unwrap();
    assert_eq!(&reader.join().unwrap(), b"hello");
    // The next bytes wait in the socket for the next read.
    (&s).write_all(b"again").unwrap();
    let mut buf = [0; 5];
    (&c).read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"again");
    assert!(!c.shared().reads());
}

/// A stream whose program reads with blocking calls from the start (a
/// blocking connect under the preload) leaves arrivals to those reads
/// before the first one waited; a read gets them from the socket.
#[test]
fn a_stream_read_blocking_from_the_start_leaves_arrivals_to_its_reads() {
    let (c, s) = pair();
    assert!(c.shared().reads());
    c.reads_blocking();
    assert!(!c.shared().reads());
    (&s).write_all(b"first").unwrap();
    let mut buf = [0; 5];
    (&c).read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"first");
    assert!(!c.shared().reads());
}

/// A released link that only waits for its peer's end (ours went: the
/// Local Peer's DisConn, the Remote Peer's DisConn and FIN) leaves the
/// progress thread's epoll set, so that what its peer still sends wakes
/// nobody, and still finishes: the thread looks at it on the
/// `DRAIN_LOOK` grid.
#[test]
fn a_link_left_only_to_drain_is_looked_at_on_the_grid() {
    let (c, s) = pair();
    c.close();
    assert!(
        c.shared().is_lazy(),
        "the Local Peer waits for our DisConn on the grid"
    );
    let mut buf = [0; 8];
    assert_eq!((&s).read(&mut buf).unwrap(), 0);
    assert!(!s.shared().is_lazy());
    s.close();
    assert!(
        s.shared().is_lazy(),
        "the Remote Peer's close left only the drain"
    );
    let left = crate::stream::progress::wait_released(Instant::now() + Duration::from_secs(5));
    assert_eq!(left, 0, "a released link did not finish");
}

/// An accepted stream answered and handed to the program
/// (`Driver::Handed`), and its peer's connect, under way until the RTR is
/// answered.
fn handed() -> (SdpStream, std::thread::JoinHandle<SdpStream>) {
    use crate::stream::{accept, Driver};
    use rustix::event::{poll, PollFd, PollFlags};

    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let client = std::thread::spawn(move || SdpStream::connect(addr).unwrap());
    let (tcp, _) = l.accept().unwrap();
    let (mut ep, config) =
        accept::responder(tcp, &crate::conn::Config::default(), Instant::now()).unwrap();
    let s = loop {
        ep = match accept::answer_request(ep, &config, Instant::now(), Driver::Handed) {
            accept::Answer::Answered(s) => break s,
            accept::Answer::Failed(e) => panic!("setup failed: {e}"),
            accept::Answer::Pending(ep) => ep,
        };
        let mut fds = [PollFd::new(ep.stream(), PollFlags::IN)];
        poll(&mut fds, None).unwrap();
    };
    (s, client)
}

/// An accepted stream handed to the program (`Driver::Handed`): until the
/// next point of the `DRAIN_LOOK` grid the progress thread leaves its
/// arrivals to the program, which an event loop watches at once (and the
/// grace ends); one that does not has the thread answer the RTR at the
/// grid, and the peer's connect completes.
#[test]
fn a_handed_stream_is_read_by_the_thread_only_after_its_grace() {
    use rustix::event::{poll, PollFd, PollFlags};

    for watched in [false, true] {
        let (s, client) = handed();
        assert!(
            !s.shared().reads(),
            "the grace leaves arrivals to the program"
        );
        if watched {
            s.watch_socket(true);
            assert!(s.shared().lock_inner().grace_until.is_none());
            // The program's own wait takes the RTR: its read pumps.
            let sock = s.shared().sock().clone();
            let mut fds = [PollFd::new(sock.as_ref(), PollFlags::IN)];
            poll(&mut fds, None).unwrap();
            assert!(s.pump());
        }
        let c = client.join().unwrap();
        until(&s, |g| g.grace_until.is_none());
        // Unwatched, the thread reads from the end of the grace on.
        assert_eq!(s.shared().reads(), !watched);
        (&c).write_all(b"hello").unwrap();
        let mut buf = [0; 5];
        (&s).read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"hello");
    }
}

/// CPU time (user and system) of this process's progress thread so far.
fn progress_thread_cpu() -> Duration {
    let tick = Duration::from_secs(1) / 100;
    for task in std::fs::read_dir("/proc/self/task").unwrap() {
        let dir = task.unwrap().path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim() != "sdp-progress" {
            continue;
        }
        let stat = std::fs::read_to_string(dir.join("stat")).unwrap();
        // Fields 14 and 15 (utime, stime), counted after the name's ')'.
        let fields: Vec<u64> = stat[stat.rfind(')').unwrap() + 2..]
            .split(' ')
            .skip(11)
            .take(2)
            .map(|f| f.parse().unwrap())
            .collect();
        return tick * (fields[0] + fields[1]) as u32;
    }
    panic!("no progress thread");
}

/// A handed stream whose program blocks in a read: the read's watch ends
/// the grace, and the deadline the progress thread knows of goes with it
/// before the reader sleeps. Kept, it came due while the poller slept,
/// and the thread, which leaves a polled link alone, found it due again
/// at once: a spin for as long as the read waited.
#[test]
fn a_grace_a_blocking_read_ended_leaves_the_thread_asleep() {
    let (s, client) = handed();
    let r = s.clone();
    let reader = std::thread::spawn(move || {
        let mut buf = [0; 5];
        (&r).read_exact(&mut buf).unwrap();
        buf
    });
    let c = client.join().unwrap();
    until(&s, |g| g.poller_active && g.grace_until.is_none());
    let published = s.shared().deadline();
    let own = s.shared().lock_inner().next_deadline(None);
    assert_eq!(published, own, "the sleeping reader left a stale deadline");
    // Past the grace's grid point: the thread sleeps through it.
    let before = progress_thread_cpu();
    std::thread::sleep(DRAIN_LOOK * 4);
    let spent = progress_thread_cpu() - before;
    assert!(
        spent < DRAIN_LOOK,
        "the progress thread spent {spent:?} while the reader slept"
    );
    (&c).write_all(b"hello").unwrap();
    assert_eq!(&reader.join().unwrap(), b"hello");
}

/// Whether `fd` polls readable now.
fn polls_readable(fd: &std::os::fd::OwnedFd) -> bool {
    use rustix::event::{poll, PollFd, PollFlags};
    let mut fds = [PollFd::new(fd, PollFlags::IN)];
    let zero = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    poll(&mut fds, Some(&zero)).unwrap();
    fds[0].revents().contains(PollFlags::IN)
}

/// A readiness descriptor on demand keeps its levels only while someone
/// says it polls it, and has them set as they are when one comes.
#[test]
fn a_readiness_descriptor_on_demand_follows_only_while_held() {
    let (c, s) = pair();
    let fd = c.readiness_shared().unwrap();
    c.readiness_on_demand(true);
    (&s).write_all(b"first").unwrap();
    until(&c, |g| g.readable());
    assert!(!polls_readable(&fd), "nobody holds it: the level stays");
    c.hold_readiness(true);
    assert!(polls_readable(&fd), "held: set as it is");
    let mut buf = [0; 5];
    (&c).read_exact(&mut buf).unwrap();
    assert!(!polls_readable(&fd), "held: followed");
    c.hold_readiness(false);
    (&s).write_all(b"again").unwrap();
    until(&c, |g| g.readable());
    assert!(!polls_readable(&fd));
    c.await_readiness(true);
    assert!(polls_readable(&fd), "a thread asleep on it counts too");
    c.await_readiness(false);
    // Off again: always followed, as the descriptor of a stream whose
    // pollers are not known.
    c.readiness_on_demand(false);
    (&c).read_exact(&mut buf).unwrap();
    assert!(!polls_readable(&fd));
}
