//! The crate's one system helper that needs `unsafe`: memory advice.
#![allow(unsafe_code)]

/// Asks the kernel to back `mem` by transparent huge pages where it can
/// (`MADV_HUGEPAGE`; with THP off, or `mem` not page-aligned, nothing
/// changes).
pub fn advise_huge(mem: &mut [u8]) {
    // SAFETY: the range is `mem`, memory we own and borrow for the call;
    // MADV_HUGEPAGE changes how the kernel backs the pages, never what
    // they hold.
    let _ = unsafe {
        rustix::mm::madvise(
            mem.as_mut_ptr().cast(),
            mem.len(),
            rustix::mm::Advice::LinuxHugepage,
        )
    };
}
