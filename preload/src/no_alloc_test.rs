//! DESIGN §6 "no allocation on the pass-through path": a counting global
//! allocator (per thread, so parallel tests do not disturb it) and the
//! hooks called on fds the preload does not manage.

use crate::abi::{epoll, io, poll, socket};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator; counting has no effect on it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: the caller's layout, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: ptr came from System.alloc with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn allocations() -> usize {
    ALLOCATIONS.with(|c| c.get())
}

/// One round of pass-through calls on a pipe and an empty epoll set.
fn round(r: libc::c_int, w: libc::c_int, ep: libc::c_int) {
    let mut buf = [0u8; 8];
    // SAFETY: our own fds and local buffers throughout.
    unsafe {
        assert_eq!(io::write(w, b"abc".as_ptr().cast(), 3), 3);
        let mut p = [libc::pollfd {
            fd: r,
            events: libc::POLLIN,
            revents: 0,
        }];
        assert_eq!(poll::poll(p.as_mut_ptr(), 1, 0), 1);
        let mut set: libc::fd_set = std::mem::zeroed();
        libc::FD_SET(r, &mut set);
        let mut tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 0,
        };
        assert_eq!(
            poll::select(
                r + 1,
                &mut set,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut tv
            ),
            1
        );
        assert_eq!(io::read(r, buf.as_mut_ptr().cast(), 8), 3);
        let d = socket::dup(w);
        assert!(d >= 0);
        assert_eq!(
            socket::fcntl(d, libc::F_GETFL, 0) & libc::O_ACCMODE,
            libc::O_WRONLY
        );
        assert_eq!(socket::close(d), 0);
        let mut ev = [libc::epoll_event { events: 0, u64: 0 }; 2];
        assert_eq!(epoll::epoll_wait(ep, ev.as_mut_ptr(), 2, 0), 0);
    }
}

#[test]
fn pass_through_calls_do_not_allocate() {
    let mut fds = [0; 2];
    // SAFETY: a local array of two ints.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: plain call.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    // The first round resolves the C functions (dlsym may allocate).
    round(fds[0], fds[1], ep);
    let before = allocations();
    for _ in 0..100 {
        round(fds[0], fds[1], ep);
    }
    assert_eq!(allocations() - before, 0);
    // SAFETY: our own fds.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
        libc::close(ep);
    }
}
