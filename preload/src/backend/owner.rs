//! Which process drives an SDP connection that `fork` made shared.
//!
//! After a fork, parent and child hold the same kernel socket, and each a
//! copy of the connection's state as it was at the fork. Only one of them
//! may go on with it: SDP state cannot be shared between address spaces,
//! and moving it with SuspComm (draft §13) is not implemented. The rule:
//! **the first process that uses the connection after the fork owns it.**
//!
//! * Before the fork every connection this process owns gets a word in a
//!   shared anonymous mapping (inherited as shared memory) set to 0, and
//!   becomes *pending* in both processes. Neither process's progress
//!   thread touches a pending connection, so whichever takes it over finds
//!   the state exactly as it was at the fork.
//! * A use (a data call, a readiness query, `epoll_wait` on a set holding
//!   it) claims the connection: compare-and-swap 0 → own pid. The winner
//!   resumes progress; the other process's copy is *lost*: its calls fail
//!   with `ENOTCONN` (logged once), and its close only lets go of the
//!   descriptors (no DisConn, no shutdown, no reset).
//! * Closing a pending connection without having used it (the parent of an
//!   accept-then-fork server) lets it go the same way and leaves the word
//!   at 0 for the other process — unless no other process holds a copy
//!   any more: the last holder to let go closes the connection, as the
//!   kernel closes a TCP socket when its last descriptor goes. So that a
//!   child that exits or execs without using the connection (a threaded
//!   server's thread closing a connection just after another thread
//!   forked) does not leave it without a close (the peer would see its
//!   TCP connection end without a DisConn, a reset), a process that lets
//!   go while another holder lives watches from its service thread
//!   ([`Orphan`]) until that holder either takes the connection or is
//!   gone, and then closes it.
//! * The holders are the pids in the connection's record; a holder is
//!   alive while it still maps the shared region (a process that exited,
//!   a zombie, or one that called `exec` no longer does), read from
//!   `/proc/PID/maps` at those rare moments only.
//! * A connection that a thread of the forking process is waiting on at
//!   the fork (a blocking call, `poll`, `select` or `epoll_wait` with it)
//!   is in use already: the parent keeps it, with its progress, and the
//!   child's copy is lost from the start. Made pending, it would strand
//!   that thread: asleep on a connection that no progress thread moves,
//!   it would never see the bytes the peer sends.
//!
//! Records (the word and the holders' pids) are never reused (a process
//! cannot know when the other one is done with one); the mapping holds
//! 256 Ki of them, reserved but only touched as used. Without a record
//! (the mapping failed or is full) the parent keeps the connection and
//! the child's copy is lost. More holders than a record has room for
//! make it crowded: then nobody knows who lets go last, and a pending
//! connection closed by all of them is let go, as before holders counted.

use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU8, AtomicUsize, Ordering};

/// Records in the shared mapping.
const RECORDS: usize = 1 << 18;

/// Holders a record names at most.
const HOLDERS: usize = 7;

/// A holder slot meaning "more holders than slots".
const CROWDED: u32 = u32::MAX;

/// A holder slot taken before a fork for the child, which puts its pid
/// there: the parent may close its copy before the child runs at all.
const FORKING: u32 = u32::MAX - 1;

/// One connection's entry in the shared mapping.
#[repr(C)]
struct Record {
    /// 0 while nobody took the connection after the last fork, else the
    /// pid of the process that did.
    word: AtomicU32,
    /// The pids of the processes holding a copy (0: free).
    holders: [AtomicU32; HOLDERS],
}

static REGION: AtomicPtr<Record> = AtomicPtr::new(std::ptr::null_mut());
static NEXT: AtomicUsize = AtomicUsize::new(0);
/// Connections of this process waiting for their first use after a fork.
static PENDING: AtomicUsize = AtomicUsize::new(0);

/// Connections of this process that are pending (see the module docs).
pub fn pending() -> usize {
    PENDING.load(Ordering::Relaxed)
}

/// A fresh shared record, or `None`.
fn alloc() -> Option<&'static Record> {
    let mut base = REGION.load(Ordering::Acquire);
    if base.is_null() {
        // SAFETY: a fresh anonymous shared mapping; no address hint.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                RECORDS * std::mem::size_of::<Record>(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        base = p.cast();
        if let Err(other) = REGION.compare_exchange(
            std::ptr::null_mut(),
            base,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            // SAFETY: our own mapping of that size, never shared.
            unsafe { libc::munmap(p, RECORDS * std::mem::size_of::<Record>()) };
            base = other;
        }
    }
    let i = NEXT.fetch_add(1, Ordering::Relaxed);
    if i >= RECORDS {
        return None;
    }
    // SAFETY: i < RECORDS records of a mapping that is never unmapped;
    // zeroed memory is a valid Record (atomics).
    Some(unsafe { &*base.add(i) })
}

/// This process's id: as the library noted it (at start and in each
/// fork child), without a system call.
fn my_pid() -> u32 {
    match crate::sys::guard::pid() {
        // SAFETY: getpid has no preconditions.
        0 => unsafe { libc::getpid() as u32 },
        p => p as u32,
    }
}

/// Whether process `pid` still holds copies: it maps the shared region
/// (forked from a holder, neither exited, a zombie, nor exec'd since).
fn maps_region(pid: u32) -> bool {
    let base = REGION.load(Ordering::Acquire);
    if base.is_null() {
        return false;
    }
    let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return false;
    };
    let start = format!("{:x}-", base as usize);
    maps.lines().any(|l| l.starts_with(&start))
}

impl Record {
    fn add_holder(&self, pid: u32) {
        if !self
            .holders
            .iter()
            .any(|h| h.load(Ordering::Acquire) == pid)
        {
            self.add_slot(pid);
        }
    }

    /// The child of a fork takes the slot its parent kept for it.
    fn child_arrives(&self, pid: u32) {
        let kept = self.holders.iter().any(|h| {
            h.compare_exchange(FORKING, pid, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        });
        if !kept {
            self.add_holder(pid);
        }
    }

    fn add_slot(&self, pid: u32) {
        for h in &self.holders {
            if h.compare_exchange(0, pid, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return;
            }
        }
        self.holders[HOLDERS - 1].store(CROWDED, Ordering::Release);
    }

    fn remove_holder(&self, pid: u32) {
        for h in &self.holders {
            let _ = h.compare_exchange(pid, 0, Ordering::AcqRel, Ordering::Acquire);
        }
    }

    /// What the other holders of a connection this process let go of say:
    /// see [`Settled`].
    fn settle(&self, me: u32) -> Settled {
        match self.word.load(Ordering::Acquire) {
            0 => {}
            pid => return Settled::Taken(pid),
        }
        let mut others = false;
        for h in &self.holders {
            match h.load(Ordering::Acquire) {
                0 => {}
                CROWDED => return Settled::Unknown,
                FORKING => others = true,
                pid if pid == me => {}
                pid if maps_region(pid) => others = true,
                // Gone: its slot is free.
                pid => {
                    let _ = h.compare_exchange(pid, 0, Ordering::AcqRel, Ordering::Acquire);
                }
            }
        }
        if others {
            return Settled::Others;
        }
        // The last holder: this process closes it, unless another one
        // took it meanwhile.
        match self
            .word
            .compare_exchange(0, me, Ordering::SeqCst, Ordering::SeqCst)
        {
            Ok(_) => Settled::Last,
            Err(pid) => Settled::Taken(pid),
        }
    }
}

/// What a process that let go of a pending connection learns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Settled {
    /// Another process took it (its pid).
    Taken(u32),
    /// Other holders live: one of them may still take it.
    Others,
    /// This process was the last holder and now owns it: it closes it.
    Last,
    /// Too many holders to know.
    Unknown,
}

/// What closing this process's last descriptor of a connection does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// This process closes the connection (it owned it, or it held the
    /// last copy after a fork, and its progress must be resumed).
    Close { resume: bool },
    /// Another process goes on with it: let go of the descriptors only.
    LetGo,
    /// Let go, but another holder lives that may exit without using it:
    /// keep the stream and hand it to an [`Orphan`] watch.
    Watch,
}

/// A pending connection this process let go of while another process
/// held a copy: [`Orphan::step`] tells, from the service thread, when it
/// is settled.
pub struct Orphan {
    record: &'static Record,
    me: u32,
}

/// What an [`Orphan`] watch found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrphanStep {
    /// Another holder took it: let go of the descriptors.
    LetGo,
    /// Every other holder is gone without taking it: close it (resume its
    /// progress first).
    Close,
    /// Look again later.
    Wait,
}

impl Orphan {
    pub fn step(&self) -> OrphanStep {
        match self.record.settle(self.me) {
            Settled::Taken(_) | Settled::Unknown => OrphanStep::LetGo,
            Settled::Others => OrphanStep::Wait,
            Settled::Last => OrphanStep::Close,
        }
    }
}

const OWNED: u8 = 0;
const PENDING_STATE: u8 = 1;
const LOST: u8 = 2;

/// The ownership of one connection, in this process.
#[derive(Debug)]
pub struct Ownership {
    state: AtomicU8,
    record: AtomicPtr<Record>,
    /// The parent kept the connection at the last fork (in use, or no
    /// record): the child's copy is lost.
    unshared: AtomicU8,
}

/// What a use finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// This process owns the connection (it did already).
    Owned,
    /// This process just took the connection over: resume its progress.
    Taken,
    /// Another process (the pid, when known) goes on with it.
    Lost(u32),
}

impl Default for Ownership {
    fn default() -> Self {
        Ownership::new()
    }
}

impl Ownership {
    /// Owned by this process.
    pub fn new() -> Ownership {
        Ownership {
            state: AtomicU8::new(OWNED),
            record: AtomicPtr::new(std::ptr::null_mut()),
            unshared: AtomicU8::new(0),
        }
    }

    /// Whether this process may drive the connection without claiming.
    #[inline]
    pub fn owned(&self) -> bool {
        self.state.load(Ordering::Acquire) == OWNED
    }

    /// Whether a fork left the connection waiting for its first use.
    pub fn is_pending(&self) -> bool {
        self.state.load(Ordering::Acquire) == PENDING_STATE
    }

    /// Whether another process goes on with the connection. Its state
    /// here is a copy this process must never touch, nor even lock: the
    /// parent keeps a connection that one of its threads was in a call
    /// on at the fork (a blocked call or a Zcopy call runs outside the
    /// fork gate), and that thread may have held the connection's lock,
    /// which the child's copy then holds for good. (A pending copy is
    /// free: no thread was inside a call on it at the fork.)
    pub fn lost(&self) -> bool {
        self.state.load(Ordering::Acquire) == LOST
    }

    fn record(&self) -> Option<&'static Record> {
        let p = self.record.load(Ordering::Acquire);
        // SAFETY: only ever set to a record of the never-unmapped region.
        (!p.is_null()).then(|| unsafe { &*p })
    }

    /// The pid of the process that took the connection, 0 if none.
    fn taker(&self) -> u32 {
        self.record().map_or(0, |r| r.word.load(Ordering::Relaxed))
    }

    /// Before a fork (other threads kept out): an owned connection becomes
    /// pending with its word at 0 and this process its one holder. False
    /// if the parent keeps it: `in_use` (a thread waits on it), or it
    /// cannot be shared (no record).
    pub fn fork_prepare(&self, in_use: bool) -> bool {
        match self.state.load(Ordering::Acquire) {
            OWNED if in_use => {
                if let Some(r) = self.record() {
                    r.word.store(my_pid(), Ordering::SeqCst);
                }
                self.unshared.store(1, Ordering::Relaxed);
                false
            }
            OWNED => {
                let record = match self.record() {
                    Some(r) => Some(r),
                    None => alloc().inspect(|r| {
                        self.record
                            .store((*r as *const Record).cast_mut(), Ordering::Release)
                    }),
                };
                let Some(record) = record else {
                    self.unshared.store(1, Ordering::Relaxed);
                    return false;
                };
                self.unshared.store(0, Ordering::Relaxed);
                for h in &record.holders {
                    h.store(0, Ordering::Relaxed);
                }
                record.holders[0].store(my_pid(), Ordering::Relaxed);
                record.holders[1].store(FORKING, Ordering::Relaxed);
                record.word.store(0, Ordering::SeqCst);
                self.state.store(PENDING_STATE, Ordering::Release);
                PENDING.fetch_add(1, Ordering::Relaxed);
                true
            }
            // Pending already (a second fork before anyone used it): it
            // stays so, the word still 0, with one more holder to come.
            PENDING_STATE => {
                if let Some(r) = self.record() {
                    r.add_slot(FORKING);
                }
                true
            }
            // Lost stays lost.
            _ => true,
        }
    }

    /// The fork failed: no child takes the slot kept for it.
    pub fn fork_failed(&self) {
        if let (PENDING_STATE, Some(r)) = (self.state.load(Ordering::Acquire), self.record()) {
            let _ = r.holders.iter().any(|h| {
                h.compare_exchange(FORKING, 0, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            });
        }
    }

    /// In the child after a fork: a pending copy makes it a holder.
    pub fn fork_child(&self) {
        match self.state.load(Ordering::Acquire) {
            OWNED if self.unshared.load(Ordering::Relaxed) == 1 => {
                self.state.store(LOST, Ordering::Release);
            }
            PENDING_STATE => {
                if let Some(r) = self.record() {
                    r.child_arrives(my_pid());
                }
            }
            _ => {}
        }
    }

    /// Marks the connection lost in this process (a connection a fork
    /// caught in setup: its setup runs on in the parent only).
    pub fn lose(&self) {
        if self.state.swap(LOST, Ordering::AcqRel) == PENDING_STATE {
            PENDING.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// A use: see [`Claim`].
    pub fn claim(&self) -> Claim {
        match self.state.load(Ordering::Acquire) {
            OWNED => return Claim::Owned,
            LOST => return Claim::Lost(self.taker()),
            _ => {}
        }
        let me = my_pid();
        let Some(record) = self.record() else {
            self.lose();
            return Claim::Lost(0);
        };
        let won = match record
            .word
            .compare_exchange(0, me, Ordering::SeqCst, Ordering::SeqCst)
        {
            Ok(_) => true,
            Err(v) => v == me,
        };
        let next = if won { OWNED } else { LOST };
        match self
            .state
            .compare_exchange(PENDING_STATE, next, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => {
                PENDING.fetch_sub(1, Ordering::Relaxed);
                if won {
                    Claim::Taken
                } else {
                    Claim::Lost(self.taker())
                }
            }
            // Another thread of this process decided first.
            Err(OWNED) => Claim::Owned,
            Err(_) => Claim::Lost(self.taker()),
        }
    }

    /// The connection's last descriptor in this process closes (or the
    /// process exits with it): see [`Release`]. A pending copy stops being
    /// a holder; the last holder takes the connection to close it.
    pub fn release(&self) -> Release {
        match self.state.load(Ordering::Acquire) {
            OWNED => return Release::Close { resume: false },
            LOST => return Release::LetGo,
            _ => {}
        }
        let me = my_pid();
        let Some(record) = self.record() else {
            self.lose();
            return Release::LetGo;
        };
        record.remove_holder(me);
        match record.settle(me) {
            Settled::Last => {
                if self
                    .state
                    .compare_exchange(PENDING_STATE, OWNED, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    PENDING.fetch_sub(1, Ordering::Relaxed);
                }
                Release::Close { resume: true }
            }
            Settled::Others => {
                self.lose();
                Release::Watch
            }
            Settled::Taken(_) | Settled::Unknown => {
                self.lose();
                Release::LetGo
            }
        }
    }

    /// The watch for a copy [`Ownership::release`] said to watch.
    pub fn orphan(&self) -> Option<Orphan> {
        Some(Orphan {
            record: self.record()?,
            me: my_pid(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_use_after_fork_owns_the_connection() {
        let o = Ownership::new();
        assert_eq!(o.claim(), Claim::Owned);
        let before = pending();
        assert!(o.fork_prepare(false));
        assert!(o.is_pending());
        assert_eq!(pending(), before + 1);
        assert_eq!(o.claim(), Claim::Taken);
        assert_eq!(o.claim(), Claim::Owned);
        assert_eq!(pending(), before);

        // The other process claimed first: this copy is lost.
        assert!(o.fork_prepare(false));
        o.record().unwrap().word.store(1, Ordering::SeqCst);
        assert_eq!(o.claim(), Claim::Lost(1));
        assert_eq!(o.release(), Release::LetGo);
        assert_eq!(Ownership::new().release(), Release::Close { resume: false });
    }

    /// A process (forked here, it only waits for its end) that maps the
    /// shared region.
    struct Holder(libc::pid_t);

    impl Holder {
        fn start() -> Holder {
            assert!(alloc().is_some());
            // SAFETY: the child only calls pause (async-signal-safe).
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                loop {
                    // SAFETY: no preconditions.
                    unsafe { libc::pause() };
                }
            }
            assert!(pid > 0);
            Holder(pid)
        }

        fn end(self) {
            // SAFETY: our child; a status we ignore.
            unsafe {
                libc::kill(self.0, libc::SIGKILL);
                libc::waitpid(self.0, std::ptr::null_mut(), 0);
            }
        }
    }

    #[test]
    fn the_last_holder_to_let_go_closes_the_connection() {
        // Closed before the child ran: the slot kept for it counts.
        let p = Ownership::new();
        assert!(p.fork_prepare(false));
        assert_eq!(p.release(), Release::Watch);
        // No other holder (the fork failed): closing a pending copy takes
        // it, to close it.
        let p = Ownership::new();
        assert!(p.fork_prepare(false));
        p.fork_failed();
        assert_eq!(p.release(), Release::Close { resume: true });
        assert!(p.owned());
        assert_eq!(p.taker(), my_pid());

        // Another holder lives: let go and watch; once it is gone without
        // taking the connection, the watch closes it.
        let q = Ownership::new();
        assert!(q.fork_prepare(false));
        let child = Holder::start();
        assert!(maps_region(child.0 as u32));
        q.record().unwrap().child_arrives(child.0 as u32);
        assert_eq!(q.release(), Release::Watch);
        let orphan = q.orphan().unwrap();
        assert_eq!(orphan.step(), OrphanStep::Wait);
        child.end();
        assert!(!maps_region(
            q.record().unwrap().holders[1].load(Ordering::Relaxed)
        ));
        assert_eq!(orphan.step(), OrphanStep::Close);
        assert_eq!(q.taker(), my_pid());

        // The other holder takes it: the watch lets go.
        let r = Ownership::new();
        assert!(r.fork_prepare(false));
        let child = Holder::start();
        r.record().unwrap().child_arrives(child.0 as u32);
        assert_eq!(r.release(), Release::Watch);
        let orphan = r.orphan().unwrap();
        r.record()
            .unwrap()
            .word
            .store(child.0 as u32, Ordering::SeqCst);
        assert_eq!(orphan.step(), OrphanStep::LetGo);
        child.end();
    }

    #[test]
    fn a_connection_in_use_at_the_fork_stays_with_the_parent() {
        let o = Ownership::new();
        assert!(o.fork_prepare(false));
        assert_eq!(o.claim(), Claim::Taken);
        let before = pending();
        assert!(!o.fork_prepare(true));
        assert!(!o.is_pending());
        assert_eq!(pending(), before);
        assert_eq!(o.claim(), Claim::Owned);
        // The child's copy names the parent.
        let child = Ownership::new();
        child
            .record
            .store(o.record.load(Ordering::Acquire), Ordering::Release);
        child.unshared.store(1, Ordering::Relaxed);
        child.fork_child();
        assert_eq!(child.claim(), Claim::Lost(my_pid()));
    }
}
