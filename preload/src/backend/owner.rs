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
//!   at 0 for the other process.
//! * A connection that a thread of the forking process is waiting on at
//!   the fork (a blocking call, `poll`, `select` or `epoll_wait` with it)
//!   is in use already: the parent keeps it, with its progress, and the
//!   child's copy is lost from the start. Made pending, it would strand
//!   that thread: asleep on a connection that no progress thread moves,
//!   it would never see the bytes the peer sends.
//!
//! Words are never reused (a process cannot know when the other one is
//! done with one); the mapping holds 1 Mi of them, reserved but only
//! touched as used. Without a word (the mapping failed or is full) the
//! parent keeps the connection and the child's copy is lost.

use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU8, AtomicUsize, Ordering};

/// Words in the shared mapping.
const WORDS: usize = 1 << 20;

static REGION: AtomicPtr<AtomicU32> = AtomicPtr::new(std::ptr::null_mut());
static NEXT: AtomicUsize = AtomicUsize::new(0);
/// Connections of this process waiting for their first use after a fork.
static PENDING: AtomicUsize = AtomicUsize::new(0);

/// Connections of this process that are pending (see the module docs).
pub fn pending() -> usize {
    PENDING.load(Ordering::Relaxed)
}

/// A fresh shared word, or `None`.
fn alloc() -> Option<&'static AtomicU32> {
    let mut base = REGION.load(Ordering::Acquire);
    if base.is_null() {
        // SAFETY: a fresh anonymous shared mapping; no address hint.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                WORDS * 4,
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
            // SAFETY: our own mapping of WORDS * 4 bytes, never shared.
            unsafe { libc::munmap(p, WORDS * 4) };
            base = other;
        }
    }
    let i = NEXT.fetch_add(1, Ordering::Relaxed);
    if i >= WORDS {
        return None;
    }
    // SAFETY: i < WORDS words of a mapping that is never unmapped; zeroed
    // memory is a valid AtomicU32.
    Some(unsafe { &*base.add(i) })
}

fn my_pid() -> u32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() as u32 }
}

const OWNED: u8 = 0;
const PENDING_STATE: u8 = 1;
const LOST: u8 = 2;

/// The ownership of one connection, in this process.
#[derive(Debug)]
pub struct Ownership {
    state: AtomicU8,
    word: AtomicPtr<AtomicU32>,
    /// The parent kept the connection at the last fork (in use, or no
    /// word): the child's copy is lost.
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
            word: AtomicPtr::new(std::ptr::null_mut()),
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

    fn word(&self) -> Option<&'static AtomicU32> {
        let p = self.word.load(Ordering::Acquire);
        // SAFETY: only ever set to a word of the never-unmapped region.
        (!p.is_null()).then(|| unsafe { &*p })
    }

    /// Before a fork (other threads kept out): an owned connection becomes
    /// pending with its word at 0. False if the parent keeps it: `in_use`
    /// (a thread waits on it), or it cannot be shared (no word).
    pub fn fork_prepare(&self, in_use: bool) -> bool {
        match self.state.load(Ordering::Acquire) {
            OWNED if in_use => {
                if let Some(word) = self.word() {
                    word.store(my_pid(), Ordering::SeqCst);
                }
                self.unshared.store(1, Ordering::Relaxed);
                false
            }
            OWNED => {
                let word = match self.word() {
                    Some(w) => Some(w),
                    None => alloc().inspect(|w| {
                        self.word
                            .store((*w as *const AtomicU32).cast_mut(), Ordering::Release)
                    }),
                };
                let Some(word) = word else {
                    self.unshared.store(1, Ordering::Relaxed);
                    return false;
                };
                self.unshared.store(0, Ordering::Relaxed);
                word.store(0, Ordering::SeqCst);
                self.state.store(PENDING_STATE, Ordering::Release);
                PENDING.fetch_add(1, Ordering::Relaxed);
                true
            }
            // Pending already (a second fork before anyone used it): it
            // stays so, the word still 0. Lost stays lost.
            _ => true,
        }
    }

    /// In the child after a fork.
    pub fn fork_child(&self) {
        if self.unshared.load(Ordering::Relaxed) == 1 && self.state.load(Ordering::Acquire) == OWNED
        {
            self.state.store(LOST, Ordering::Release);
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
            LOST => {
                return Claim::Lost(self.word().map_or(0, |w| w.load(Ordering::Relaxed)));
            }
            _ => {}
        }
        let me = my_pid();
        let Some(word) = self.word() else {
            self.lose();
            return Claim::Lost(0);
        };
        let won = match word.compare_exchange(0, me, Ordering::SeqCst, Ordering::SeqCst) {
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
                    Claim::Lost(word.load(Ordering::Relaxed))
                }
            }
            // Another thread of this process decided first.
            Err(OWNED) => Claim::Owned,
            Err(_) => Claim::Lost(word.load(Ordering::Relaxed)),
        }
    }

    /// The connection's last descriptor in this process closes while it is
    /// pending or lost: let go without claiming (the word stays as it is,
    /// so the other process may still take it). True if the connection
    /// was not this process's to close.
    pub fn release(&self) -> bool {
        match self.state.load(Ordering::Acquire) {
            OWNED => false,
            _ => {
                self.lose();
                true
            }
        }
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
        o.word().unwrap().store(1, Ordering::SeqCst);
        assert_eq!(o.claim(), Claim::Lost(1));
        assert!(o.release());

        // Closing a pending copy lets it go.
        let p = Ownership::new();
        assert!(p.fork_prepare(false));
        assert!(p.release());
        assert_eq!(p.word().unwrap().load(Ordering::SeqCst), 0);
        assert!(!Ownership::new().release());
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
            .word
            .store(o.word.load(Ordering::Acquire), Ordering::Release);
        child.unshared.store(1, Ordering::Relaxed);
        child.fork_child();
        assert_eq!(child.claim(), Claim::Lost(my_pid()));
    }
}
