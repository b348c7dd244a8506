//! The one CPU check behind the front end's dispatched loops.
//!
//! Each hot loop is an `#[inline(always)]` body compiled twice: as is (the portable build targets
//! plain x86-64, SSE2), and inside a `#[target_feature(enable = "avx2,fma")]` wrapper that runs
//! when [`has_avx2_fma`] says the CPU has those instructions. Rust never contracts `a * b + c`
//! into a fused multiply-add by itself, so the two copies compute the same bits unless a body
//! asks for `mul_add` (exactly rounded either way): the dispatch changes speed only.

/// Whether the CPU runs AVX2 and FMA (`is_x86_feature_detected!` caches the answer).
#[inline]
pub(crate) fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}
