//! Filling a large buffer over the caller's rayon pool without zeroing it first.

use rayon::prelude::*;
use std::mem::MaybeUninit;

/// Elements one task of the pool fills: enough to amortise the hand-off, while a 30 s clip
/// (480,000 samples) still splits into 15 tasks.
const BLOCK: usize = 1 << 15;

/// A vector of `len` elements, written in blocks over the pool by `fill(first, block)`, which
/// writes the elements `first..first + block.len()` and returns how many it wrote.
///
/// It writes into the vector's spare capacity: a zeroed buffer (`vec![0.0; len]`) was written
/// twice, the first time by one thread (glibc's `calloc` clears reused heap memory), which for
/// a clip's 3.8 MB of samples cost more than the conversion itself.
pub(crate) fn par_fill<T: Send>(
    len: usize,
    fill: impl Fn(usize, &mut [MaybeUninit<T>]) -> usize + Sync,
) -> Vec<T> {
    let mut out = Vec::with_capacity(len);
    out.spare_capacity_mut()[..len]
        .par_chunks_mut(BLOCK)
        .enumerate()
        .for_each(|(i, block)| {
            let written = fill(i * BLOCK, block);
            // Checked rather than trusted: a block left short would be read uninitialised.
            assert_eq!(written, block.len(), "par_fill: a block was not filled");
        });
    // SAFETY: each block of the first `len` elements was written in full (asserted above; a
    // failed assertion panics out of `for_each` before this line).
    unsafe { out.set_len(len) };
    out
}
