//! The crate's system helpers that need `unsafe`: memory of its own,
//! mapped from the kernel, for the same-host rings.
#![allow(unsafe_code)]

use core::ptr::NonNull;

/// Anonymous memory mapped for us alone: zeroed, its pages appearing as
/// they are first written, unmapped on drop. Unlike a heap allocation it
/// never comes from memory the allocator reuses (which `calloc` would
/// zero page by page) and its advice ends with it.
pub struct Region {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a Region owns its mapping as a Vec owns its buffer; the bytes
// are reached only through `&self`/`&mut self`.
unsafe impl Send for Region {}
// SAFETY: as above; `&Region` gives only shared reads.
unsafe impl Sync for Region {}

impl Region {
    /// `len` zeroed bytes (`None` if the kernel refuses).
    pub fn new(len: usize) -> Option<Region> {
        if len == 0 {
            return Some(Region::default());
        }
        // SAFETY: a fresh private anonymous mapping at an address the
        // kernel picks overlaps nothing of ours.
        let p = unsafe {
            rustix::mm::mmap_anonymous(
                core::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::PRIVATE,
            )
        }
        .ok()?;
        Some(Region {
            ptr: NonNull::new(p.cast())?,
            len,
        })
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` bytes at `ptr` are mapped readable while we live
        // (a dangling pointer with `len` 0 is a valid empty slice).
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, writable, and `&mut self` is unique.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Asks the kernel to back `range` by transparent huge pages where it
    /// can (`MADV_HUGEPAGE`; with THP off nothing changes). The range is
    /// rounded to whole pages by the kernel: it starts on one, and the
    /// last page is ours.
    pub fn advise_huge(&mut self, range: core::ops::Range<usize>) {
        let Some(mem) = self.as_mut_slice().get_mut(range) else {
            return;
        };
        // SAFETY: the range lies inside our mapping, borrowed for the
        // call; MADV_HUGEPAGE changes how the kernel backs the pages,
        // never what they hold.
        let _ = unsafe {
            rustix::mm::madvise(
                mem.as_mut_ptr().cast(),
                mem.len(),
                rustix::mm::Advice::LinuxHugepage,
            )
        };
    }
}

impl Default for Region {
    /// No memory.
    fn default() -> Region {
        Region {
            ptr: NonNull::dangling(),
            len: 0,
        }
    }
}

impl Clone for Region {
    fn clone(&self) -> Region {
        let mut copy = Region::new(self.len).unwrap_or_default();
        if copy.len == self.len {
            copy.as_mut_slice().copy_from_slice(self.as_slice());
        }
        copy
    }
}

impl core::fmt::Debug for Region {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "Region({} bytes)", self.len)
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: the mapping is ours and no slice of it outlives
            // `self`.
            let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
        }
    }
}

/// Has the C allocator hand the pages of its free memory back to the
/// kernel. glibc keeps what `free` got in its arenas (it gives back only
/// the top of a heap), so the buffers an idle connection gave back would
/// stay in the process's resident memory.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn malloc_trim(pad: usize) -> core::ffi::c_int;
        }
        // SAFETY: glibc's malloc_trim takes no pointer and may be called
        // from any thread at any time; it only takes the arenas' locks.
        let _ = unsafe { malloc_trim(0) };
    }
}
