//! Filling a large buffer over the caller's rayon pool without zeroing it first.

use rayon::prelude::*;
use std::mem::MaybeUninit;

/// Samples one task of the pool takes (here and in the audio front end's finite check): enough
/// to amortise the hand-off, while a 30 s clip (480,000 samples) still splits into 15 tasks.
pub(crate) const BLOCK: usize = 1 << 15;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_element_across_block_edges_is_written_once() {
        let len = 2 * BLOCK + 3;
        let out = par_fill(len, |first, block| {
            let values = block.iter_mut().zip(first..);
            values.map(|(o, i)| o.write(i as u64)).count()
        });
        assert_eq!(out.len(), len);
        assert!(out.iter().enumerate().all(|(i, &v)| v == i as u64));
        assert!(par_fill::<u8>(0, |_, block| block.len()).is_empty());
    }

    #[test]
    #[should_panic(expected = "a block was not filled")]
    fn a_block_left_short_panics_instead_of_being_read() {
        par_fill::<u8>(BLOCK + 1, |_, block| block.len() - 1);
    }
}
