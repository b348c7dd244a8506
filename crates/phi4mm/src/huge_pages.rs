//! The plugin's global allocator: the system allocator, asking the kernel for transparent huge
//! pages on large blocks.
//!
//! Why: IREE allocates each call's transient memory (through `eerie`, from this allocator) and
//! frees it when the call ends. glibc serves blocks that large with a fresh `mmap`, so every call
//! faulted its transients in again 4 KiB at a time: about 40,000 page faults for each crop of
//! the vision tower's 167 MB of transients. With this allocator the IREE vision tower of the
//! benchmark towers ran 1644 → 1388 ms per image (`docs/benchmarks.md`, "Transients in huge
//! pages"); the decoder's transients are small and it did not move. It is what glibc's
//! `glibc.malloc.hugetlb=1` tunable does, here for this library's allocations only, without an
//! environment setting. The host process is untouched: a plugin library has its own global
//! allocator.
//!
//! Memory is still returned on `free` as before; a huge page only rounds a block's resident
//! size up to 2 MiB inside blocks of at least [`LARGE`].

use std::alloc::{GlobalAlloc, Layout, System};

/// Blocks from this size on are advised (a few 2 MiB pages at least, so rounding costs little).
pub const LARGE: usize = 4 << 20;

pub struct LargeBlocksInHugePages;

// SAFETY: every call is forwarded to `System` unchanged; `advise` only sets a paging hint on
// whole pages inside the block just returned, which changes no byte of it.
unsafe impl GlobalAlloc for LargeBlocksInHugePages {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as received; the caller upholds `alloc`'s contract.
        let p = unsafe { System.alloc(layout) };
        advise(p, layout.size());
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        advise(p, layout.size());
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` through this allocator, with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as `dealloc`; the caller upholds `realloc`'s contract.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        advise(p, new_size);
        p
    }
}

/// Asks for huge pages on the whole pages of `[p, p + len)` when the block is large.
#[cfg(target_os = "linux")]
fn advise(p: *mut u8, len: usize) {
    if p.is_null() || len < LARGE {
        return;
    }
    // madvise needs page-aligned bounds, and pages are 16 or 64 KiB on some arm64 kernels.
    // SAFETY: sysconf only reads a system constant.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let start = (p as usize).next_multiple_of(page);
    let end = (p as usize + len) & !(page - 1);
    // SAFETY: the range lies inside a block this allocator just returned; MADV_HUGEPAGE is a
    // hint, and its failure (THP disabled, an old kernel) leaves the block as it was.
    unsafe {
        libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
    }
}

#[cfg(not(target_os = "linux"))]
fn advise(_: *mut u8, _: usize) {}

#[cfg(test)]
mod tests {
    use super::*;

    /// A large block is usable whole, and reallocation keeps its bytes.
    #[test]
    fn large_blocks_are_ordinary_memory() {
        let a = LargeBlocksInHugePages;
        let layout = Layout::from_size_align(3 * LARGE + 123, 64).unwrap();
        // SAFETY: each block is used within its layout and freed once, with the layout it
        // was last given.
        unsafe {
            let p = a.alloc_zeroed(layout);
            assert!(!p.is_null());
            let s = std::slice::from_raw_parts_mut(p, layout.size());
            assert!(s.iter().all(|&b| b == 0));
            s.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
            let q = a.realloc(p, layout, 5 * LARGE);
            let s = std::slice::from_raw_parts(q, layout.size());
            assert!(s.iter().enumerate().all(|(i, &b)| b == i as u8));
            a.dealloc(q, Layout::from_size_align(5 * LARGE, 64).unwrap());
        }
    }
}
