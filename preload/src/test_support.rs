//! A fake SDP endpoint for the unit tests of the hooks: application data
//! goes in with `deliver`, sends land in `sent`, readiness levels are kept
//! on a socket pair end as the `SdpEndpoint` contract asks (the stream
//! layer's own readiness descriptor).

use crate::sdp::{
    Block, Counters, Errno, LevelWatch, Messages, Mode, Readiness, RecvFlags, SdpEndpoint,
    SendFlags, Shutdown, Stats, WakeFd,
};
use crate::table::{self, Entry, SdpSide, Transport};
use libc::c_int;
use sdp_core::stream::readiness::Readiness as Levels;
use std::collections::VecDeque;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

/// A call the endpoint was asked to make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    Recv(RecvFlags, Block),
    Send(Block),
}

#[derive(Default)]
struct State {
    calls: Vec<Call>,
    rx: VecDeque<u8>,
    tx: Vec<u8>,
    send_room: usize,
    write_shut: bool,
    closes: usize,
    flushes: usize,
    panic: bool,
}

pub struct FakeEndpoint {
    state: Mutex<State>,
    levels: Mutex<Levels>,
    wake: OwnedFd,
    /// Set up ([`FakeEndpoint::set_connected`]): level watches are taken,
    /// as a connected stream takes them; before, only the wake fd tells.
    watches: Mutex<Option<Vec<Arc<dyn LevelWatch>>>>,
}

impl FakeEndpoint {
    pub fn new() -> Arc<FakeEndpoint> {
        let levels = Levels::new().unwrap();
        let wake = levels.user_fd().try_clone_to_owned().unwrap();
        let ep = Arc::new(FakeEndpoint {
            state: Mutex::new(State {
                send_room: usize::MAX,
                ..State::default()
            }),
            levels: Mutex::new(levels),
            wake,
            watches: Mutex::new(None),
        });
        ep.with(|_| ());
        ep
    }

    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let mut s = self.state.lock().unwrap();
        let r = f(&mut s);
        let (readable, writable) = (!s.rx.is_empty(), s.send_room > 0 || s.write_shut);
        self.levels.lock().unwrap().set(readable, writable).unwrap();
        if let Some(watches) = &*self.watches.lock().unwrap() {
            for w in watches {
                w.levels(readable, writable);
            }
        }
        r
    }

    /// The setup ended: from now on the endpoint takes level watches.
    pub fn set_connected(&self) {
        *self.watches.lock().unwrap() = Some(Vec::new());
    }

    /// The calls the endpoint was asked to make, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.with(|s| s.calls.clone())
    }

    /// Sleeps as the call's `block` lets it, until the levels poll
    /// `events`: `EAGAIN` at the deadline, `EINTR` for a signal.
    fn sleep(&self, events: i16, block: Block) -> Result<(), Errno> {
        let Block::Until(deadline) = block else {
            return Err(libc::EAGAIN);
        };
        let ms = deadline.map_or(-1, |d| {
            d.saturating_duration_since(std::time::Instant::now())
                .as_millis() as c_int
        });
        let mut p = libc::pollfd {
            fd: self.wake.as_raw_fd(),
            events,
            revents: 0,
        };
        // SAFETY: one local pollfd.
        match unsafe { libc::poll(&mut p, 1, ms) } {
            0 => Err(libc::EAGAIN),
            r if r > 0 => Ok(()),
            _ => Err(std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO)),
        }
    }

    /// New application data.
    pub fn deliver(&self, data: &[u8]) {
        self.with(|s| s.rx.extend(data));
    }
    pub fn take_all(&self) {
        self.with(|s| s.rx.clear());
    }
    pub fn set_send_room(&self, n: usize) {
        self.with(|s| s.send_room = n);
    }
    pub fn shut_write(&self) {
        self.with(|s| s.write_shut = true);
    }
    pub fn sent(&self) -> Vec<u8> {
        self.with(|s| s.tx.clone())
    }
    pub fn closes(&self) -> usize {
        self.with(|s| s.closes)
    }
    /// Makes every later `recv` panic (an engine bug).
    pub fn break_recv(&self) {
        self.with(|s| s.panic = true);
    }
    pub fn flushes(&self) -> usize {
        self.with(|s| s.flushes)
    }
    /// Takes the endpoint's lock until the guard goes: a call on the
    /// endpoint meanwhile waits for it.
    pub fn hold(&self) -> Held<'_> {
        Held(self.state.lock().unwrap())
    }
}

/// [`FakeEndpoint::hold`].
pub struct Held<'a>(#[allow(dead_code)] std::sync::MutexGuard<'a, State>);

extern "C" fn ignore_signal(_: c_int) {}

/// Runs `call` on this thread while another thread holds `ep`'s lock; once
/// `call` sleeps waiting for a lock, a signal whose handler has no
/// `SA_RESTART` (SIGUSR1) interrupts the sleep, and the lock goes 20 ms
/// later. The lock is then taken as usual (the standard library's mutex
/// waits again), but the interrupted wait left `EINTR` in `errno` — what a
/// program's signal does to a call of the library that meets a lock taken
/// by the progress thread.
pub fn with_lock_wait_interrupted<R>(ep: &Arc<FakeEndpoint>, call: impl FnOnce() -> R) -> R {
    // SAFETY: a handler without SA_RESTART for SIGUSR1, which no other test
    // uses; an all-zero sigaction is valid before it is filled in.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = ignore_signal as extern "C" fn(c_int) as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
    }
    // SAFETY: plain calls.
    let (me, tid) = unsafe { (libc::pthread_self(), libc::gettid()) };
    let (locked, is_locked) = std::sync::mpsc::channel();
    let ep = ep.clone();
    let holder = std::thread::spawn(move || {
        let held = ep.hold();
        locked.send(()).unwrap();
        // /proc names the system call a thread sleeps in.
        let syscall = format!("/proc/self/task/{tid}/syscall");
        let futex = libc::SYS_futex.to_string();
        let give_up = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::fs::read_to_string(&syscall)
            .unwrap_or_default()
            .split_whitespace()
            .next()
            != Some(futex.as_str())
        {
            assert!(
                std::time::Instant::now() < give_up,
                "the call never waited for the lock"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        // SAFETY: the calling thread is alive: it waits for us in join().
        unsafe { libc::pthread_kill(me, libc::SIGUSR1) };
        std::thread::sleep(std::time::Duration::from_millis(20));
        drop(held);
    });
    is_locked.recv().unwrap();
    let r = call();
    holder.join().unwrap();
    r
}

impl SdpEndpoint for FakeEndpoint {
    fn readiness(&self) -> Readiness {
        self.with(|s| Readiness {
            readable: !s.rx.is_empty(),
            writable: s.send_room > 0 || s.write_shut,
            ..Readiness::default()
        })
    }
    fn wake_fd(&self) -> WakeFd {
        self.wake.as_raw_fd()
    }
    fn watch_levels(&self, w: Arc<dyn LevelWatch>) -> bool {
        let mut watches = self.watches.lock().unwrap();
        let Some(list) = watches.as_mut() else {
            return false;
        };
        list.push(w.clone());
        drop(watches);
        let (readable, writable) =
            self.with(|s| (!s.rx.is_empty(), s.send_room > 0 || s.write_shut));
        w.levels(readable, writable);
        true
    }
    fn unwatch_levels(&self, w: &Arc<dyn LevelWatch>) {
        if let Some(list) = self.watches.lock().unwrap().as_mut() {
            list.retain(|x| !Arc::ptr_eq(x, w));
        }
    }
    fn recv(
        &self,
        bufs: &mut [IoSliceMut<'_>],
        flags: RecvFlags,
        block: Block,
    ) -> Result<usize, Errno> {
        if self.with(|s| s.panic) {
            panic!("fake endpoint: recv broken on purpose");
        }
        self.with(|s| s.calls.push(Call::Recv(flags, block)));
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let mut done = 0;
        loop {
            let n = self.with(|s| {
                let mut n = 0;
                let mut at = done;
                for b in bufs.iter_mut() {
                    let skip = at.min(b.len());
                    at -= skip;
                    for byte in b[skip..].iter_mut() {
                        match s.rx.get(n) {
                            Some(&v) => {
                                *byte = v;
                                n += 1;
                            }
                            None => break,
                        }
                    }
                }
                if !flags.peek {
                    s.rx.drain(..n);
                }
                n
            });
            done += n;
            if (done > 0 && !flags.waitall) || (total > 0 && done == total) || total == 0 {
                return Ok(done);
            }
            if let Err(e) = self.sleep(libc::POLLIN, block) {
                return if done > 0 { Ok(done) } else { Err(e) };
            }
        }
    }
    fn send(&self, bufs: &[IoSlice<'_>], _flags: SendFlags, block: Block) -> Result<usize, Errno> {
        self.with(|s| s.calls.push(Call::Send(block)));
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let mut done = 0;
        loop {
            let r = self.with(|s| {
                if s.write_shut {
                    return Err(libc::EPIPE);
                }
                let mut n = 0;
                for &byte in bufs.iter().flat_map(|b| b.iter()).skip(done) {
                    if s.send_room == 0 {
                        break;
                    }
                    s.tx.push(byte);
                    s.send_room -= 1;
                    n += 1;
                }
                Ok(n)
            });
            match r {
                Ok(n) => done += n,
                Err(e) => return if done > 0 { Ok(done) } else { Err(e) },
            }
            if done == total || (done > 0 && block == Block::Never) {
                return Ok(done);
            }
            if let Err(e) = self.sleep(libc::POLLOUT, block) {
                return if done > 0 { Ok(done) } else { Err(e) };
            }
        }
    }
    fn shutdown(&self, _how: Shutdown) -> Result<(), Errno> {
        self.with(|s| s.write_shut = true);
        Ok(())
    }
    fn close(&self, _nonblocking: bool) {
        self.with(|s| s.closes += 1);
    }
    fn getsockopt(
        &self,
        _level: c_int,
        _name: c_int,
        _value: &mut [u8],
    ) -> Option<Result<usize, Errno>> {
        None
    }
    fn setsockopt(&self, _level: c_int, _name: c_int, _value: &[u8]) -> Result<(), Errno> {
        Ok(())
    }
    fn fionread(&self) -> usize {
        self.with(|s| s.rx.len())
    }
    fn at_mark(&self) -> bool {
        false
    }
    fn take_error(&self) -> Option<Errno> {
        None
    }
    fn stats(&self) -> Option<Stats> {
        Some(Stats {
            tx_mode: Mode::Combined,
            rx_mode: Mode::Combined,
            bytes: Counters::default(),
            messages: Messages::default(),
            local_credits: 0,
            remote_credits: 0,
            same_host: 0,
        })
    }
    fn fork_child(&self) {}
    fn flush_at_exit(&self, _deadline: std::time::Instant) {
        self.with(|s| s.flushes += 1);
    }
}

/// A connected pair of Unix stream sockets (stand-ins for the kernel TCP
/// socket and its peer).
pub fn socketpair() -> (c_int, c_int) {
    let mut fds = [0; 2];
    // SAFETY: a local array of two ints.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    assert_eq!(r, 0);
    (fds[0], fds[1])
}

/// Puts `fd` in SDP state with `ep` behind it.
pub fn install(fd: c_int, ep: Arc<FakeEndpoint>) {
    let mut e = Entry::new(false, false);
    e.transport = Transport::Sdp;
    e.sdp = SdpSide::stream(ep, false);
    table::insert(fd, e);
}

/// Takes `fd` out of the table and closes it.
pub fn uninstall(fd: c_int) {
    table::remove(fd);
    // SAFETY: our own fd.
    unsafe { libc::close(fd) };
}
