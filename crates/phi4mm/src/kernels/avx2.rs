//! The GEMV's bf16 inner loop with AVX2 and FMA: eight bf16 weights widened to f32 per load
//! (exact: bf16 is the top half of an f32) and fused-multiply-added against each input row.

use std::arch::x86_64::*;

/// 8 bf16 values → 8 f32 (exact: bf16 is the top half of an f32).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn widen8(p: *const u16) -> __m256 {
    // SAFETY: the caller passes a pointer to 8 readable u16 (an unaligned load is fine) and has
    // checked AVX2 (this function's target feature).
    unsafe {
        let h = _mm_loadu_si128(p.cast());
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
    }
}

#[inline]
#[target_feature(enable = "avx2,fma")]
fn hsum(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps(v, 1);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

/// Dot of one bf16 weight row `w` against `rows` f32 rows of `x` (row stride `w.len()`).
///
/// # Safety
/// The CPU must support AVX2 and FMA; `x` must hold `rows * w.len()` values.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dot_rows_bf16_avx2(w: &[u16], x: &[f32], rows: usize, acc: &mut [f32]) {
    // SAFETY: the caller guarantees AVX2/FMA and `x.len() >= rows * w.len()`; every load below
    // reads `w[..n]` or `x[r * n..(r + 1) * n]` for `r < rows`, in bounds by those lengths.
    unsafe {
        let n = w.len();
        let wp = w.as_ptr();
        let xp = x.as_ptr();
        let n32 = n / 32 * 32;
        let n8 = n / 8 * 8;
        if rows == 1 {
            // Four independent accumulators hide the FMA latency on the single dot product.
            let (mut a0, mut a1, mut a2, mut a3) = (
                _mm256_setzero_ps(),
                _mm256_setzero_ps(),
                _mm256_setzero_ps(),
                _mm256_setzero_ps(),
            );
            let mut k = 0;
            while k < n32 {
                a0 = _mm256_fmadd_ps(widen8(wp.add(k)), _mm256_loadu_ps(xp.add(k)), a0);
                a1 = _mm256_fmadd_ps(widen8(wp.add(k + 8)), _mm256_loadu_ps(xp.add(k + 8)), a1);
                a2 = _mm256_fmadd_ps(widen8(wp.add(k + 16)), _mm256_loadu_ps(xp.add(k + 16)), a2);
                a3 = _mm256_fmadd_ps(widen8(wp.add(k + 24)), _mm256_loadu_ps(xp.add(k + 24)), a3);
                k += 32;
            }
            while k < n8 {
                a0 = _mm256_fmadd_ps(widen8(wp.add(k)), _mm256_loadu_ps(xp.add(k)), a0);
                k += 8;
            }
            let mut s = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
            while k < n {
                s += f32::from_bits((*wp.add(k) as u32) << 16) * *xp.add(k);
                k += 1;
            }
            acc[0] = s;
            return;
        }
        // Several rows: each widened weight vector feeds up to four row accumulators.
        let mut r0 = 0;
        while r0 < rows {
            let nr = (rows - r0).min(4);
            let mut a = [_mm256_setzero_ps(); 4];
            let mut k = 0;
            while k < n8 {
                let wv = widen8(wp.add(k));
                for (j, aj) in a.iter_mut().enumerate().take(nr) {
                    *aj = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xp.add((r0 + j) * n + k)), *aj);
                }
                k += 8;
            }
            for j in 0..nr {
                let mut s = hsum(a[j]);
                for kk in n8..n {
                    s += f32::from_bits((*wp.add(kk) as u32) << 16) * *xp.add((r0 + j) * n + kk);
                }
                acc[r0 + j] = s;
            }
            r0 += nr;
        }
    }
}
